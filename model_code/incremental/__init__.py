"""IncDSI's mathematics (Kishore et al., ICML 2023): the document-id head (``incdsi``), building and
fine-tuning it (``head``, ``build``) and tuning its addition hyper-parameters (``tuning``). The
``incdsi`` retriever kind calls them; a retriever's versions, whatever its kind, are
``model_code.versions``.
"""
