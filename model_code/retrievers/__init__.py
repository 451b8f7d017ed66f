"""Retrieval methods behind one contract (``base.Retriever``), chosen by ``retriever.kind``.

Importing this package registers the built-in kinds; ``registry`` looks kinds up, saves and
loads them. See docs/retrievers.md for adding a kind.
"""

from model_code.retrievers import bm25, dense, incdsi, mlr, svdr  # noqa: F401  (registers the built-in kinds)
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
