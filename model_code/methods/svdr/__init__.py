"""SVDR (retriever.kind svdr): a sparse vocabulary encoder searched through a binary token index.
``retriever`` (the kind and ``SVDRSettings``), ``model`` (the sparse encoder), ``token_bags``,
``loss`` and ``training`` (its objective, retrieved negatives and recipe). See docs/svdr.md."""
