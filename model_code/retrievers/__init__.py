"""Retrieval methods behind one contract (``base.Retriever``), chosen by ``retriever.kind``.

Importing this package registers the built-in kinds (``bm25`` and ``dense`` here, the others in
their method packages, ``model_code/methods/<name>/retriever.py``); ``registry`` looks kinds up,
saves and loads them. See docs/retrievers.md for adding a kind.
"""

from model_code.methods.incdsi import retriever as _incdsi  # noqa: F401  (registers the built-in kinds)
from model_code.methods.mlr import retriever as _mlr  # noqa: F401
from model_code.methods.svdr import retriever as _svdr  # noqa: F401
from model_code.retrievers import bm25, dense  # noqa: F401
from model_code.retrievers.base import Retriever, SearchHit, UpdateContext, VectorView
from model_code.retrievers.registry import (
           apply_deltas,
           kind_class,
           kind_names,
           load_chain,
           load_retriever,
           read_manifest,
           register,
           save_retriever,
           save_retriever_delta,
)

__all__ = ["Retriever", "SearchHit", "UpdateContext", "VectorView", "apply_deltas", "kind_class", "kind_names", "load_chain",
           "load_retriever", "read_manifest", "register", "save_retriever", "save_retriever_delta"]
