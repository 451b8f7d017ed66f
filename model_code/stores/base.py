"""The index-store contract: where a retriever kind keeps its vectors.

A *store* holds rows of vectors, each with a document id, and answers top-k inner-product
searches over them. A kind builds one (``build``), searches it, adds and removes documents, reads
stored vectors back (drift statistics compare them instead of re-encoding), copies it (the drift
report measures the index with a batch added, leaving the deployed one alone) and saves what
changed since load (a version's delta) or the whole of it. Shapes:

* ``dense``: float32 rows; several rows may carry one id (MLR's multi-vector documents: a removal
  takes every row of the id, a search may return an id more than once).
* ``sparse``: SciPy CSR rows over a vocabulary (SVDR's token bags and sparse embeddings).

A store is chosen by ``index.backend`` and the shape a kind needs (``store_class``). Kinds, drift,
dev selection and mining reach vectors through this contract only, so a backend is one module
(``faiss_store`` is the embedded default) or a class registered from a user's own code: a store
registered in a test file runs the conformance tests (``tests/conformance/test_store_protocol.py``,
which also run every registered store) and the chain.
``in_files`` says whether a saved store is the files ``save`` wrote into a version directory
(FAISS, CSR) or a reference to data kept by a service.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from model_code.config import IndexParams

STORE_FILE = "store.json"  # which backend and shape a saved store directory holds


class VectorStore(ABC):
    backend: ClassVar[str]
    shape: ClassVar[str]  # "dense" or "sparse"
    in_files: ClassVar[bool] = True

    @classmethod
    @abstractmethod
    def build(cls, vectors: Any, doc_ids: list[str], settings: IndexParams | None = None) -> VectorStore:
        """A store of ``vectors`` (one row per entry of ``doc_ids``); ``settings`` None: exact search."""

    @abstractmethod
    def add(self, vectors: Any, doc_ids: list[str]) -> None:
        """Append rows; an id with live rows already is refused (ValueError)."""

    @abstractmethod
    def remove(self, doc_ids: list[str]) -> int:
        """Remove every row of each id (KeyError for an id without live rows); return the rows removed."""

    @abstractmethod
    def search(self, queries: Any, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-``k`` scores and ids per query row, best first (fewer when fewer rows are live)."""

    @abstractmethod
    def vectors(self, doc_ids: list[str]) -> Any:
        """The stored rows of ``doc_ids`` (one per id: dense stores of single-vector documents)."""

    @abstractmethod
    def live_ids(self) -> list[str]:
        """The id of every live row, in row order (an id once per row)."""

    @abstractmethod
    def copy(self) -> VectorStore:
        """An independent copy: changing it leaves this store as it was."""

    @staticmethod
    def exact_settings(settings: IndexParams) -> IndexParams:
        """``settings`` for exact search (default: this store searches exactly already)."""
        return settings

    @abstractmethod
    def save_files(self, directory: Path) -> None:
        """Write the whole store into ``directory``."""

    @classmethod
    @abstractmethod
    def load_files(cls, directory: Path) -> VectorStore:
        """Load what ``save_files`` wrote; what it saves next as a delta starts from here."""

    @abstractmethod
    def save_delta_files(self, directory: Path) -> None:
        """Write the rows added and removed since load (or build) into ``directory``."""

    @abstractmethod
    def apply_delta_files(self, directory: Path) -> None:
        """Replay a delta ``save_delta_files`` wrote, on the store it was made from."""

    # -- the saved directory names its backend, so any caller can load it -------------------------
    def save(self, directory: Path) -> None:
        self.save_files(Path(directory))
        _mark(self, Path(directory))

    def save_delta(self, directory: Path) -> None:
        self.save_delta_files(Path(directory))
        _mark(self, Path(directory))

    def apply_delta(self, directory: Path) -> None:
        self.apply_delta_files(Path(directory))


def check_rows(count: int, doc_ids: list[str]) -> None:
    """One vector per id (a ValueError otherwise): a store pairs rows with ids in order, so one
    short list would give documents each other's vectors, or leave rows no id names."""
    if count != len(doc_ids):
        raise ValueError(f"{count} vectors for {len(doc_ids)} document ids: a store takes one vector per id")


def _mark(store: VectorStore, directory: Path) -> None:
    (directory / STORE_FILE).write_text(json.dumps({"backend": store.backend, "shape": store.shape}) + "\n")
