"""Kind ``mlr``: multi-layer document representations (MLR: *Investigating Multi-layer
Representations for Dense Passage Retrieval*, arXiv:2509.23861), at search time (training:
``methods/mlr/objective.py``, ``methods/mlr/loss.py``; docs/mlr.md).

The query is one vector from the encoder's last layer. A document is represented by its pooled
vector at each of ``retriever.mlr.layers`` (last layer first, as the reference code stacks them),
pooled within the layer as the model was trained (masked mean for MiniLM, [CLS] for CLS models).
Four ways to use them (``retriever.mlr.pooling``), each trained as it is searched:

* ``multi``: multi-vector; a document scores the maximum of the query's inner product with its
  layer vectors. The FAISS index holds N·m rows (all of a document's rows carry its id), is
  searched k·m deep, and the first (highest) hit of each document is kept, so the ranking is
  exactly the max over layers; fewer than k documents are returned rather than padded.
* ``mean``: one vector per document, the average of its layer vectors (the paper's average
  pooling).
* ``scalar_mix``: one vector per document, its layer vectors weighted by the softmax weights the
  train stage learned (``methods/mlr/layer_mix.py``), copied into the manifest.
* ``self_contrastive``: training scores the other layers (Eq. 5-7); the index holds the last
  layer's vector alone, so search costs what the dense kind's does.

Each layer vector is L2-normalised before use. The reference code scores raw dot products of an
encoder trained for them; the encoders here are trained (or pre-trained, as MiniLM) for cosine
similarity, whose intermediate layers differ widely in norm, so without normalisation one layer
would decide every maximum. Additions encode the new documents' layer vectors and append all m rows; removals take all m rows.
Drift statistics see no single vector per document here, so the freshness loop decides on
document volume alone for this kind.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from model_code.config import Params
from model_code.data.ingested import IngestedData
from model_code.layout import Layout
from model_code.methods.mlr.layer_mix import load_weights
from model_code.retrievers.base import Retriever, SearchHit, UpdateContext
from model_code.retrievers.neural import EncoderHandle
from model_code.retrievers.registry import register
from model_code.stores import VectorStore, load_store, store_class

if TYPE_CHECKING:
    from model_code.training.recipe import TrainingRecipe


class MLRSettings(BaseModel):
    """Kind mlr: documents as pooled vectors of several encoder layers (MLR)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: list[int] = Field(default_factory=lambda: [6, 4], description="encoder layers whose pooled vectors "
                              "represent a document, last layer first (MiniLM has 6; 0 is the embedding layer)")
    pooling: Literal["multi", "mean", "scalar_mix", "self_contrastive"] = Field(
        "multi", description="multi: one vector per layer, a document scores its best layer; mean: the average of "
        "the layer vectors; scalar_mix: their average under learned softmax weights (initialised uniform); "
        "self_contrastive: trained with MLR Eq. 5-7, searched by the last layer's vector alone. The train stage "
        "(train.method contrastive) trains each as it is searched")
    reg_weight: float = Field(1.0, ge=0, description="self_contrastive: lambda of the regulariser over the "
                              "positive's layer scores (MLR Eq. 6-7; the reference scripts use 1.0 for BERT-base, 0.1 "
                              "from a RetroMAE start)")
    mix_learning_rate: float | None = Field(
        None, gt=0, description="scalar_mix: peak learning rate of the layer weights' logits, on the encoder's "
        "schedule; null = train.learning_rate, as the reference code (at ~2e-5 the weights stay near uniform for "
        "hundreds of steps)")

    @field_validator("layers")
    @classmethod
    def _distinct_descending(cls, layers: list[int]) -> list[int]:
        if not layers or len(set(layers)) != len(layers) or min(layers) < 0 or layers != sorted(layers, reverse=True):
            raise ValueError(f"retriever.mlr.layers must be distinct layer numbers, last layer first; got {layers}")
        return layers


def check_layers(settings: MLRSettings, num_layers: int) -> None:
    if settings.layers[0] != num_layers:
        raise ValueError(f"retriever.mlr.layers starts with layer {settings.layers[0]}, but the encoder's last "
                         f"layer is {num_layers}: list the last layer first")


def indexed_layers(settings: MLRSettings) -> list[int]:
    """The layers a document's index rows are made of: self-contrastive training searches the last alone."""
    return settings.layers[:1] if settings.pooling == "self_contrastive" else settings.layers


def rows_per_document(settings: MLRSettings) -> int:
    return len(settings.layers) if settings.pooling == "multi" else 1


def row_ids(settings: MLRSettings, doc_ids: list[str]) -> list[str]:
    """The document id of every index row, in the order ``document_vectors`` lays them out."""
    return [doc_id for doc_id in doc_ids for _ in range(rows_per_document(settings))]


def document_vectors(encoder: EncoderHandle, settings: MLRSettings, documents: pd.DataFrame,
                     weights: np.ndarray | None = None, desc: str | None = None) -> np.ndarray:
    """The index rows of ``documents``: (n·m, d), document-major, for ``multi``; (n, d) otherwise.
    ``weights``: the scalar mix's."""
    check_layers(settings, encoder.model.num_layers)  # before the corpus is encoded
    layers = encoder.embed_document_layers(documents, indexed_layers(settings), desc=desc)
    if settings.pooling == "multi":
        return layers.reshape(-1, layers.shape[-1])
    if settings.pooling == "scalar_mix":
        return np.einsum("nmd,m->nd", layers, weights)
    return layers.mean(axis=1)  # mean; self_contrastive's one layer is itself


@register
class MLRRetriever(Retriever):
    kind = "mlr"
    settings_model = MLRSettings

    def __init__(self, index: VectorStore, encoder: EncoderHandle, settings: MLRSettings, info: dict[str, Any] | None = None,
                 weights: np.ndarray | None = None):
        self.index, self.encoder, self.settings = index, encoder, settings
        self.info = info or {}
        self.weights = weights  # scalar_mix: the trained layer weights

    @classmethod
    def training_recipe(cls) -> type[TrainingRecipe]:
        from model_code.methods.mlr.training import (
            MLRRecipe,  # training code stays out of what searching imports
        )

        return MLRRecipe

    @classmethod
    def corpus_encoding(cls, params: Params, layout: Layout):
        """Every indexed layer's vectors, as ``document_vectors`` asks the cache for them; layers
        the encoder lacks are refused here, before the shards spend hours on vectors the index
        stage would refuse."""
        settings = params.retriever.settings(cls.kind)
        encoder = EncoderHandle.from_params(layout.encoder, params.encoder, layout.embedding_cache)
        check_layers(settings, encoder.model.num_layers)
        return lambda documents: encoder.embed_document_layers(documents, indexed_layers(settings))

    @classmethod
    def build(cls, params: Params, data: IngestedData, layout: Layout) -> MLRRetriever:
        settings = params.retriever.settings(cls.kind)
        encoder = EncoderHandle.from_params(layout.encoder, params.encoder, layout.embedding_cache)
        weights = load_weights(layout.encoder, settings.layers) if settings.pooling == "scalar_mix" else None
        start = time.perf_counter()
        vectors = document_vectors(encoder, settings, data.corpus, weights, desc="encoding corpus layers")
        encoded = time.perf_counter()
        index = store_class(params.index.backend, "dense").build(
            vectors, row_ids(settings, data.corpus["doc_id"].tolist()), params.index)
        return cls(index, encoder, settings, {
            "backend": params.index.backend, "factory": params.index.factory, "dimension": int(vectors.shape[1]), "rows": int(vectors.shape[0]),
            "encode_seconds": encoded - start, "build_seconds": time.perf_counter() - encoded}, weights)

    def save_files(self, directory: Path) -> dict[str, Any]:
        self.index.save(directory / "index")
        weights = {} if self.weights is None else {"mlr_weights": self.weights.tolist()}
        return {**self.info, **self.encoder.manifest(), "mlr": self.settings.model_dump(), **weights}

    @classmethod
    def load_files(cls, directory: Path, manifest: dict[str, Any], encoder_dir: Path | None) -> MLRRetriever:
        return cls(load_store(directory / "index"), EncoderHandle.from_manifest(encoder_dir, manifest),
                   MLRSettings.model_validate(manifest["mlr"]),
                   {k: manifest[k] for k in ("factory", "dimension", "rows") if k in manifest},
                   np.asarray(manifest["mlr_weights"], dtype=np.float32) if "mlr_weights" in manifest else None)

    def search(self, queries: list[str], k: int, desc: str | None = None) -> list[SearchHit]:
        depth = k * rows_per_document(self.settings)
        scores, ids = self.index.search(self.encoder.embed_queries(queries, desc=desc), depth)
        hits = []
        for row_scores, row_ids in zip(scores, ids):
            best: dict[str, float] = {}  # the first hit of a document is its best layer
            for score, doc_id in zip(row_scores.tolist(), row_ids):
                if doc_id not in best:
                    best[doc_id] = score
            top = list(best.items())[:k]
            hits.append(SearchHit(doc_ids=[d for d, _ in top], scores=[s for _, s in top]))
        return hits

    def live_ids(self) -> list[str]:
        return list(dict.fromkeys(self.index.live_ids()))

    def add(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        start = time.perf_counter()
        vectors = document_vectors(self.encoder, self.settings, documents, self.weights)
        encoded = time.perf_counter()
        self.index.add(vectors, row_ids(self.settings, documents["doc_id"].tolist()))
        n = len(documents)
        return {"encode_ms_per_doc": 1000 * (encoded - start) / n,
                "add_ms_per_doc": 1000 * (time.perf_counter() - encoded) / n}

    def remove(self, doc_ids: list[str]) -> int:
        self.index.remove(doc_ids)
        return len(set(doc_ids))

    def save_delta(self, directory: Path) -> dict[str, Any]:
        self.index.save_delta(directory / "index_delta")  # a document's m rows move together
        return {}

    def apply_delta(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.index.apply_delta(directory / "index_delta")
