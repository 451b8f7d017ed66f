"""Kind ``incdsi``: search through an IncDSI document-id head (Kishore et al., ICML 2023), and add
each new document by optimising one new row of it.

The state is the head (``head/``: rows, representative queries, ids, and ``addition.json``, the
addition parameters tuned when it was built) plus a dense retriever over the same encoder
(``index/``), which the drift statistics measure against; both are updated together. When
``index.backend`` keeps vectors in a service (Milvus: ``in_files`` False), the head's rows are
also a store of it (``head_index/``) and searches go there: every server reads an addition's
optimised row as soon as it is written. The rows stay in ``head/`` too, because an addition's
optimisation reads every old row (its constraints).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from model_code.config import Params
from model_code.data.generator import generate_queries
from model_code.data.ingested import IngestedData
from model_code.layout import Layout
from model_code.methods.incdsi.build import build_deployable_head
from model_code.methods.incdsi.head import ADDITION_FILE, AdditionParams, IncDSIHead
from model_code.methods.incdsi.settings import IncDSIParams
from model_code.retrievers.base import Retriever, SearchHit, UpdateContext, VectorView
from model_code.retrievers.dense import DenseRetriever, hits
from model_code.retrievers.registry import register
from model_code.stores import VectorStore, load_store, store_class

HEAD_INDEX, HEAD_INDEX_DELTA = "head_index", "head_index_delta"  # the head's rows in a service's store


@register
class IncDSIRetriever(Retriever):
    kind = "incdsi"
    settings_model = IncDSIParams

    def __init__(self, head: IncDSIHead, addition: dict, dense: DenseRetriever, info: dict[str, Any] | None = None,
                 head_index: VectorStore | None = None):
        self.head, self.addition, self.dense = head, addition, dense
        self.info = info or {}  # the head's build summary, kept in the manifest
        self.head_index = head_index  # the head's rows in a service's store (Milvus), searched instead of in process

    @property
    def index(self) -> VectorStore:
        return self.dense.index

    @classmethod
    def build(cls, params: Params, data: IngestedData, layout: Layout) -> IncDSIRetriever:
        dense = DenseRetriever.build(params, data, layout)
        head, addition, summary = build_deployable_head(
            params.retriever.settings("incdsi"), data, pd.read_parquet(layout.ingested / "doc_groups.parquet"),
            pd.read_parquet(layout.generated_queries), dense.encoder.embed_documents, dense.encoder.embed_queries)
        in_head = set(head.doc_ids)  # a head over the old documents: the index beside it holds those alone,
        if outside := [d for d in dense.live_ids() if d not in in_head]:  # or adding a new one is "already indexed"
            dense.remove(outside)
        store = store_class(params.index.backend, "dense")
        head_index = None if store.in_files else store.build(head.weights.numpy(), head.doc_ids, params.index)
        return cls(head, addition, dense, {"head": summary}, head_index)

    @classmethod
    def build_for_dev_selection(cls, params: Params, data: IngestedData, layout: Layout) -> DenseRetriever:
        """The encoder's own dense index: the head (and its addition tuning, ``tune_trials`` runs)
        is fitted once, after training, on the encoder dev chose."""
        return DenseRetriever.build(params, data, layout)

    def save_files(self, directory: Path) -> dict[str, Any]:
        self.head.save(directory / "head")
        (directory / "head" / ADDITION_FILE).write_text(json.dumps(self.addition, indent=2) + "\n")
        if self.head_index is not None:
            self.head_index.save(directory / HEAD_INDEX)
        return {**self.dense.save_files(directory), **self.info}

    @classmethod
    def load_files(cls, directory: Path, manifest: dict[str, Any], encoder_dir: Path | None) -> IncDSIRetriever:
        addition = json.loads((directory / "head" / ADDITION_FILE).read_text())
        head_index = load_store(directory / HEAD_INDEX) if (directory / HEAD_INDEX).is_dir() else None
        return cls(IncDSIHead.load(directory / "head"), addition,
                   DenseRetriever.load_files(directory, manifest, encoder_dir), {"head": manifest.get("head")}, head_index)

    def search(self, queries: list[str], k: int, desc: str | None = None) -> list[SearchHit]:
        searched = self.head if self.head_index is None else self.head_index
        return hits(*searched.search(self.dense.encoder.embed_queries(queries, desc=desc), k))

    def live_ids(self) -> list[str]:
        return self.head.live_ids()

    def add(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        timings = self.dense.add(documents, context)  # the index the drift statistics read
        vectors = self.index.vectors(documents["doc_id"].tolist())
        return {**timings, **self._add_rows(documents, vectors, context)}

    def _add_rows(self, documents: pd.DataFrame, vectors: np.ndarray, context: UpdateContext) -> dict[str, Any]:
        queries = context.queries
        if queries is None:
            queries = generate_queries(documents, context.params.querygen.generator,
                                       context.layout.querygen_cache)
        addition, source = AdditionParams(**self.addition["params"]), f"head/{ADDITION_FILE}"  # chosen at build
        timings, not_separable = [], []
        for position, doc_id in enumerate(documents["doc_id"]):
            texts = queries.loc[queries["doc_id"] == doc_id, "query"].tolist()
            if not texts:  # every generated query was ambiguous: fall back to the document itself
                texts = documents.loc[documents["doc_id"] == doc_id, "text"].tolist()
            query_vectors = torch.from_numpy(self.dense.encoder.embed_queries(texts))
            document = torch.from_numpy(vectors[position]) if addition.init == "document" else None
            result = self.head.add(doc_id, query_vectors, addition, document)  # times the optimisation only, as the paper
            timings.append(result.milliseconds)
            if not result.separable:
                not_separable.append(doc_id)
        if self.head_index is not None:  # the optimised rows, written where every server searches
            added = documents["doc_id"].tolist()
            self.head_index.add(self.head.weights[-len(added):].numpy(), added)
        return {
            "addition_params": {"source": source, **asdict(addition)},
            "add_ms_median": statistics.median(timings),
            "add_ms_p95": float(np.percentile(timings, 95)),
            "not_separable": not_separable,
        }

    @classmethod
    def update_health(cls, manifests: list[dict[str, Any]]) -> dict[str, float]:
        """The share of added documents whose constraints could not all be met
        (``freshness.thresholds.max_unseparable_share``)."""
        additions = [m for m in manifests if m.get("operation") in ("add", "upsert") and "not_separable" in m]
        added = sum(m["added"] + m.get("edited", 0) for m in additions)  # an edit adds its new text again
        return {"unseparable_share": sum(len(m["not_separable"]) for m in additions) / added if added else 0.0}

    def remove(self, doc_ids: list[str]) -> int:
        self.dense.remove(doc_ids)
        if self.head_index is not None:
            self.head_index.remove(doc_ids)
        return self.head.remove_all(doc_ids)

    def save_delta(self, directory: Path) -> dict[str, Any]:
        self.head.save_delta(directory / "head_delta")  # the tuned addition parameters never change
        if self.head_index is not None:
            self.head_index.save_delta(directory / HEAD_INDEX_DELTA)
        return self.dense.save_delta(directory)

    def apply_delta(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.head = self.head.apply_delta(directory / "head_delta")
        if self.head_index is not None:
            self.head_index.apply_delta(directory / HEAD_INDEX_DELTA)
        self.dense.apply_delta(directory, manifest)

    def vector_view(self) -> VectorView:
        return self.dense.vector_view()
