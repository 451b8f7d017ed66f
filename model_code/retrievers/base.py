"""The retriever contract: what every retrieval method provides to the rest of the system.

A *kind* (dense, incdsi, bm25, ...) is one subclass of ``Retriever``, registered with
``registry.register``. The stages build it (``build``), evaluation and serving call ``search``,
the freshness loop and the update commands call ``add`` / ``remove`` / ``edit`` on a loaded copy
and save it as a new version (only what changed, ``save_delta``, when the kind can), and drift
statistics read ``vector_view``. Nothing outside ``model_code/retrievers`` knows which kinds exist.

Vectors live in the store of ``index.backend`` (``model_code.stores``: FAISS by default), which
the kind builds and loads through ``store_class`` / ``load_store``, so another backend replaces it
without touching a kind or a caller.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
from pydantic import BaseModel

if TYPE_CHECKING:
    from model_code.config import Params
    from model_code.data.ingested import IngestedData
    from model_code.layout import Layout
    from model_code.stores import VectorStore
    from model_code.training.recipe import TrainingRecipe


@dataclass
class SearchHit:
    doc_ids: list[str]
    scores: list[float]


@dataclass
class UpdateContext:
    """What an update may reuse instead of recomputing: the deployment's params and layout, the
    batch's document vectors from the drift report (doc id -> vector, made by this retriever's
    own encoder) and its generated queries (``doc_id``, ``query``)."""

    params: Params
    layout: Layout
    embeddings: dict[str, np.ndarray] | None = None
    queries: pd.DataFrame | None = None


@dataclass
class VectorView:
    """The dense vectors a retriever keeps, as drift statistics need them: the stored vectors
    (``index``) and functions embedding new documents and queries into the same space."""

    index: VectorStore
    embed_documents: Any  # (documents frame) -> (n, d) float32, L2-normalised
    embed_queries: Any  # (list of texts) -> (n, d) float32, L2-normalised


class Retriever(ABC):
    kind: ClassVar[str]
    settings_model: ClassVar[type[BaseModel] | None] = None  # its section ``retriever.<kind>`` in params.yaml
    uses_encoder: ClassVar[bool] = True  # reads the trained encoder (models/encoder): train/cluster stages run for it
    uses_tree: ClassVar[bool] = True  # can use the cluster stage's corpus tree (HCE training); False skips that stage
    index_shape: ClassVar[str | None] = "dense"  # the store shape it keeps (model_code.stores); None: no store

    # -- building and persistence ------------------------------------------------------------
    @classmethod
    @abstractmethod
    def build(cls, params: Params, data: IngestedData, layout: Layout) -> Retriever:
        """Index the ingested corpus (``layout.encoder`` holds the trained encoder when
        ``uses_encoder``)."""

    @classmethod
    def training_recipe(cls) -> type[TrainingRecipe]:
        """How the train stage fine-tunes this kind's encoder (``uses_encoder`` kinds): its model,
        objective and the ``train.method`` values it accepts (default: the dense encoder)."""
        from model_code.training.recipe import TrainingRecipe

        return TrainingRecipe

    @classmethod
    def corpus_encoding(cls, params: Params, layout: Layout) -> Callable[[pd.DataFrame], Any] | None:
        """How ``build`` encodes the corpus, through the embedding cache: the ``encode-corpus``
        stage runs it shard by shard, and ``build`` then reads every vector from the cache. None:
        the kind encodes nothing ahead of its build (default for kinds without an encoder)."""
        if not cls.uses_encoder:
            return None
        from model_code.retrievers.neural import EncoderHandle

        return EncoderHandle.from_params(layout.encoder, params.encoder, layout.embedding_cache).embed_documents

    @classmethod
    def build_for_dev_selection(cls, params: Params, data: IngestedData, layout: Layout) -> Retriever:
        """What scores a training checkpoint on dev (``train.dev_every``): by default the kind's own
        build. A kind that fits more on top of the encoder after training may score the encoder
        alone instead, sparing that fit at every score."""
        return cls.build(params, data, layout)

    @abstractmethod
    def save_files(self, directory: Path) -> dict[str, Any]:
        """Write the retriever's files into ``directory``; return what ``load_files`` needs
        besides them (it lands in the manifest)."""

    @classmethod
    @abstractmethod
    def load_files(cls, directory: Path, manifest: dict[str, Any], encoder_dir: Path | None) -> Retriever:
        """Load what ``save_files`` wrote."""

    # -- searching ---------------------------------------------------------------------------
    @abstractmethod
    def search(self, queries: list[str], k: int, desc: str | None = None) -> list[SearchHit]:
        """Top-``k`` documents per query text, best first (fewer when the corpus is smaller);
        ``desc`` labels a progress bar for long query lists."""

    @abstractmethod
    def live_ids(self) -> list[str]:
        """Ids of the documents it can return."""

    # -- keeping it fresh --------------------------------------------------------------------
    @abstractmethod
    def add(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        """Add validated documents (``doc_id``, ``title``, ``text``; at least one, none of them
        indexed yet: ``versions.apply`` calls it so); return timings and counts for the version's
        manifest."""

    @abstractmethod
    def remove(self, doc_ids: list[str]) -> int:
        """Remove indexed documents; return how many were removed."""

    def edit(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        """Replace indexed documents by their new text (default: remove, then add)."""
        self.remove(documents["doc_id"].tolist())
        return self.add(documents, context)

    # -- versions stored as what changed -----------------------------------------------------
    def save_delta(self, directory: Path) -> dict[str, Any] | None:
        """Write what changed since this retriever was loaded (or built) into ``directory`` and
        return what ``apply_delta`` needs besides it; None (the default) when the kind keeps no
        such record, and every version is then stored whole."""
        return None

    def apply_delta(self, directory: Path, manifest: dict[str, Any]) -> None:
        """Replay, on the version it was made from, a delta that ``save_delta`` wrote."""
        raise NotImplementedError(f"the {self.kind} retriever stores no deltas")

    @classmethod
    def update_health(cls, manifests: list[dict[str, Any]]) -> dict[str, float]:
        """Kind-specific health of the updates in a lineage (the manifests of its versions, oldest
        first), as drift statistics the freshness thresholds can check (default: none)."""
        return {}

    def vector_view(self) -> VectorView | None:
        """The vectors drift statistics compare, or None for a kind without dense vectors
        (the freshness loop then decides on document volume alone)."""
        return None
