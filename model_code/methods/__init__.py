"""One package per method: ``model_code/methods/<name>/`` holds everything only that method uses
(its retriever kind, settings, model, loss, training objective and recipe), named by role. ``<name>``
is the method's ``retriever.kind`` or ``train.method`` value; what lives outside these packages is
shared (the encoder, pairs, negatives mining, the training loop, dev selection, metrics, stores,
versions). ``benchmarks/provenance.py`` reads a module's owner from its package.
"""
