"""HCE (train.method hce): the Hierarchical Corpus Encoder's training against the corpus tree.
``settings`` (``train.hce``), ``loss`` (the tree terms), ``objective`` and ``training`` (EM
co-training of encoder and tree). The corpus tree itself (``model_code/hierarchy/tree.py``) is
shared: the drift statistics and the cluster stage use it. See docs/hce.md."""
