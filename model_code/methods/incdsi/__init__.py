"""IncDSI (retriever.kind incdsi; Kishore et al., ICML 2023): a document-id head to which new
documents are added by optimising one new row. ``retriever`` (the kind), ``settings``, ``head``
(the head and its addition), ``head_training`` (building and fine-tuning it), ``build`` and
``tuning`` (the addition hyper-parameters). A retriever's versions, whatever its kind, are
``model_code.versions``. See docs/incdsi.md."""
