"""MLR (retriever.kind mlr): documents as their vectors at several encoder layers. ``retriever``
(the kind and ``MLRSettings``), ``layer_mix`` (the scalar mix), ``loss``, ``objective`` and
``training`` (its recipe). See docs/mlr.md."""
