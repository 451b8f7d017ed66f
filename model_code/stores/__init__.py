"""Index stores: the registry of backends (``index.backend``) and the shapes each provides.

``store_class(backend, shape)`` is how a kind gets its store; ``load_store(directory)`` loads a
saved store whatever its backend (the directory names it); ``exact_store(vectors, ids)`` is the
in-process exact search that dev scoring and hard-negative mining use, whatever backend serves.
Built-in: ``faiss`` (dense rows in FAISS, sparse rows in SciPy CSR: both files in a version) and
``milvus`` (dense rows in a Milvus collection per lineage, each version a view of it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from model_code.stores.base import STORE_FILE, VectorStore

if TYPE_CHECKING:
    from model_code.config import IndexParams

_STORES: dict[tuple[str, str], type[VectorStore]] = {}
DEFAULT_BACKEND = "faiss"


def register_store(cls: type[VectorStore]) -> type[VectorStore]:
    """Class decorator: make ``cls`` the ``cls.shape`` store of ``index.backend: <cls.backend>``."""
    key = (cls.backend, cls.shape)
    existing = _STORES.get(key)
    if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"the {cls.shape} store of backend {cls.backend!r} is already {existing.__qualname__}")
    _STORES[key] = cls
    return cls


def unregister_store(backend: str, shape: str) -> None:
    _STORES.pop((backend, shape), None)


def backends() -> list[str]:
    return sorted({backend for backend, _ in _STORES})


def store_class(backend: str, shape: str) -> type[VectorStore]:
    if (backend, shape) not in _STORES:
        having = [b for b, s in _STORES if s == shape]
        raise ValueError(f"index.backend {backend!r} has no {shape} store; backends with one: {', '.join(sorted(having))}")
    return _STORES[(backend, shape)]


def load_store(directory: str | Path) -> VectorStore:
    """The store saved in ``directory`` (by ``VectorStore.save``), with the class that saved it.
    A directory from before stores named themselves holds FAISS (``index.faiss``) or CSR files."""
    directory = Path(directory)
    marker = directory / STORE_FILE
    if marker.is_file():
        saved = json.loads(marker.read_text())
        backend, shape = saved["backend"], saved["shape"]
    else:
        backend, shape = DEFAULT_BACKEND, "dense" if (directory / "index.faiss").is_file() else "sparse"
    return store_class(backend, shape).load_files(directory)


def exact_store(vectors, doc_ids: list[str], shape: str = "dense") -> VectorStore:
    """An in-process store searched exactly (every row scored), whatever backend serves: dev
    scoring and negative mining are a process's own computations, never a service's collection."""
    return store_class(DEFAULT_BACKEND, shape).build(vectors, doc_ids)


def exact_settings(settings: IndexParams) -> IndexParams:
    """``settings`` made to search every row exactly, in process (dev selection scores each
    checkpoint through the kind's own build, and must not depend on an approximate index)."""
    exact = settings.model_copy(update={"backend": DEFAULT_BACKEND})
    return store_class(DEFAULT_BACKEND, "dense").exact_settings(exact)


from model_code.stores import csr_store, faiss_store, milvus_store  # noqa: F401  - the built-in backends register

__all__ = ["DEFAULT_BACKEND", "VectorStore", "backends", "exact_settings", "exact_store", "load_store", "register_store",
           "store_class", "unregister_store"]
