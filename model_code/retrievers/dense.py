"""Kind ``dense``: the trained encoder's document vectors in the dense store of ``index.backend``
(FAISS by default; HCE §5.3: new documents are encoded and appended, nothing is retrained)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from model_code.config import Params
from model_code.data.ingested import IngestedData
from model_code.layout import Layout
from model_code.retrievers.base import Retriever, SearchHit, UpdateContext, VectorView
from model_code.retrievers.neural import EncoderHandle, reuse_or_embed
from model_code.retrievers.registry import register
from model_code.stores import VectorStore, load_store, store_class


def hits(scores, ids: list[list[str]]) -> list[SearchHit]:
    return [SearchHit(doc_ids=row_ids, scores=row[: len(row_ids)].tolist()) for row, row_ids in zip(scores, ids)]


def build_index(params: Params, encoder: EncoderHandle, data: IngestedData) -> tuple[VectorStore, dict[str, float]]:
    """Encode the corpus and index it; with the two timings."""
    start = time.perf_counter()
    vectors = encoder.embed_texts(data.passages(), desc="encoding corpus")
    encoded = time.perf_counter()
    index = store_class(params.index.backend, "dense").build(vectors, data.corpus["doc_id"].tolist(), params.index)
    return index, {"backend": params.index.backend, "factory": params.index.factory, "dimension": int(vectors.shape[1]),
                   "encode_seconds": encoded - start, "build_seconds": time.perf_counter() - encoded}


@register
class DenseRetriever(Retriever):
    kind = "dense"

    def __init__(self, index: VectorStore, encoder: EncoderHandle, info: dict[str, Any] | None = None):
        self.index, self.encoder = index, encoder
        self.info = info or {}  # what the build measured, kept in the manifest

    @classmethod
    def build(cls, params: Params, data: IngestedData, layout: Layout) -> DenseRetriever:
        encoder = EncoderHandle.from_params(layout.encoder, params.encoder, layout.embedding_cache)
        index, info = build_index(params, encoder, data)
        return cls(index, encoder, info)

    def save_files(self, directory: Path) -> dict[str, Any]:
        self.index.save(directory / "index")
        return {**self.info, **self.encoder.manifest()}

    @classmethod
    def load_files(cls, directory: Path, manifest: dict[str, Any], encoder_dir: Path | None) -> DenseRetriever:
        info = {k: manifest[k] for k in ("backend", "factory", "dimension") if k in manifest}
        return cls(load_store(directory / "index"), EncoderHandle.from_manifest(encoder_dir, manifest), info)

    def search(self, queries: list[str], k: int, desc: str | None = None) -> list[SearchHit]:
        return hits(*self.index.search(self.encoder.embed_queries(queries, desc=desc), k))

    def live_ids(self) -> list[str]:
        return self.index.live_ids()

    def add(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        start = time.perf_counter()
        vectors = reuse_or_embed(self.encoder, documents, context.embeddings)
        encoded = time.perf_counter()
        self.index.add(vectors, documents["doc_id"].tolist())
        n = len(documents)
        return {"encode_ms_per_doc": 1000 * (encoded - start) / n,
                "add_ms_per_doc": 1000 * (time.perf_counter() - encoded) / n}

    def remove(self, doc_ids: list[str]) -> int:
        return self.index.remove(doc_ids)

    def save_delta(self, directory: Path) -> dict[str, Any]:
        self.index.save_delta(directory / "index_delta")
        return {}

    def apply_delta(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.index.apply_delta(directory / "index_delta")

    def vector_view(self) -> VectorView:
        return VectorView(self.index, self.encoder.embed_documents, self.encoder.embed_queries)
