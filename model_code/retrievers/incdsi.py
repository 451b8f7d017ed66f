"""Kind ``incdsi``: search through an IncDSI document-id head (Kishore et al., ICML 2023), and add
each new document by optimising one new row of it.

The state is the head (``head/``: rows, representative queries, ids, and ``addition.json``, the
addition parameters tuned when it was built) plus the dense index of the same encoder
(``index/``), which the drift statistics measure against; both are updated together.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from model_code.config import IncDSIParams, Params
from model_code.data.generator import generate_queries
from model_code.data.ingested import IngestedData
from model_code.incremental.build import build_deployable_head
from model_code.incremental.incdsi import ADDITION_FILE, AdditionParams, IncDSIHead
from model_code.index.faiss_index import DocIndex
from model_code.layout import Layout
from model_code.retrievers.base import Retriever, SearchHit, UpdateContext, VectorView
from model_code.retrievers.dense import build_index, hits
from model_code.retrievers.neural import EncoderHandle, reuse_or_embed
from model_code.retrievers.registry import register


@register
class IncDSIRetriever(Retriever):
    kind = "incdsi"
    settings_model = IncDSIParams

    def __init__(self, head: IncDSIHead, addition: dict, index: DocIndex, encoder: EncoderHandle,
                 info: dict[str, Any] | None = None):
        self.head, self.addition, self.index, self.encoder = head, addition, index, encoder
        self.info = info or {}

    @classmethod
    def build(cls, params: Params, data: IngestedData, layout: Layout) -> IncDSIRetriever:
        encoder = EncoderHandle.from_params(layout.encoder, params.encoder)
        index, info = build_index(params, encoder, data)
        head, addition, summary = build_deployable_head(
            params.retriever.settings("incdsi"), data, pd.read_parquet(layout.ingested / "doc_groups.parquet"),
            pd.read_parquet(layout.generated_queries), encoder.embed_documents, encoder.embed_queries)
        return cls(head, addition, index, encoder, {**info, "head": summary})

    def save_files(self, directory: Path) -> dict[str, Any]:
        self.head.save(directory / "head")
        (directory / "head" / ADDITION_FILE).write_text(json.dumps(self.addition, indent=2) + "\n")
        self.index.save(directory / "index")
        return {**self.info, **self.encoder.manifest()}

    @classmethod
    def load_files(cls, directory: Path, manifest: dict[str, Any], encoder_dir: Path | None) -> IncDSIRetriever:
        addition = json.loads((directory / "head" / ADDITION_FILE).read_text())
        info = {k: manifest[k] for k in ("factory", "dimension", "head") if k in manifest}
        return cls(IncDSIHead.load(directory / "head"), addition, DocIndex.load(directory / "index"),
                   EncoderHandle.from_manifest(encoder_dir, manifest), info)

    def search(self, queries: list[str], k: int, desc: str | None = None) -> list[SearchHit]:
        return hits(*self.head.search(self.encoder.embed_queries(queries, desc=desc), k))

    def live_ids(self) -> list[str]:
        return self.head.live_ids()


    def add(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        start = time.perf_counter()
        vectors = reuse_or_embed(self.encoder, documents, context.embeddings)
        encoded = time.perf_counter()
        self.index.add(vectors, documents["doc_id"].tolist())
        dense = {"encode_ms_per_doc": 1000 * (encoded - start) / len(documents),
                 "add_ms_per_doc": 1000 * (time.perf_counter() - encoded) / len(documents)}
        return {**dense, **self._add_rows(documents, vectors, context)}

    def _add_rows(self, documents: pd.DataFrame, vectors: np.ndarray, context: UpdateContext) -> dict[str, Any]:
        queries = context.queries
        if queries is None:
            queries = generate_queries(documents, context.params.querygen.generator,
                                       context.layout.root / ".cache" / "querygen" / "queries.parquet")
        addition, source = AdditionParams(**self.addition["params"]), f"head/{ADDITION_FILE}"  # chosen at build
        timings, not_separable = [], []
        for position, doc_id in enumerate(documents["doc_id"]):
            texts = queries.loc[queries["doc_id"] == doc_id, "query"].tolist()
            if not texts:  # every generated query was ambiguous: fall back to the document itself
                texts = documents.loc[documents["doc_id"] == doc_id, "text"].tolist()
            query_vectors = torch.from_numpy(self.encoder.embed_queries(texts))
            document = torch.from_numpy(vectors[position]) if addition.init == "document" else None
            result = self.head.add(doc_id, query_vectors, addition, document)  # times the optimisation only, as the paper
            timings.append(result.milliseconds)
            if not result.separable:
                not_separable.append(doc_id)
        return {
            "addition_params": {"source": source, **asdict(addition)},
            "add_ms_median": statistics.median(timings),
            "add_ms_p95": float(np.percentile(timings, 95)),
            "not_separable": not_separable,
        }

    def remove(self, doc_ids: list[str]) -> int:
        self.index.remove(doc_ids)
        return self.head.remove_all(doc_ids)

    def vector_view(self) -> VectorView:
        return VectorView(self.index, self.encoder.embed_documents, self.encoder.embed_queries)
