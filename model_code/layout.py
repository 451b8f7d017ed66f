"""Where every stage reads and writes, relative to one workspace root.

DVC (``dvc.yaml``) and Dagster (``WorkspaceResource``) both resolve paths through this class,
so the two ways of running the pipeline produce byte-for-byte the same artifact layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    root: Path

    def __init__(self, root: str | Path = "."):
        object.__setattr__(self, "root", Path(root).resolve())

    # -- ingestion ---------------------------------------------------------------------------
    @property
    def ingested(self) -> Path:
        """Validated corpus, queries, qrels per split and the old/new/tune split."""
        return self.root / "data" / "ingested"

    @property
    def ingest_report(self) -> Path:
        """Validation summary, great-expectations results (JSON + HTML) and rejected rows."""
        return self.root / "reports" / "ingest"

    # -- query generation --------------------------------------------------------------------
    @property
    def pseudo_queries(self) -> Path:
        return self.root / "data" / "pseudo_queries.parquet"

    @property
    def generated_queries(self) -> Path:
        """Generated (or extractive) queries per document, for the IncDSI head."""
        return self.root / "data" / "generated_queries.parquet"

    @property
    def querygen_cache(self) -> Path:
        """Generated queries by document content hash, shared by the stage, the inbox batches and updates."""
        return self.root / ".cache" / "querygen" / "queries.parquet"

    @property
    def embedding_cache(self) -> Path:
        """Vectors by encoder, side, length and text hash (``models/embedding_cache.py``): each text
        encoded once by the stages that use one encoder."""
        return self.root / ".cache" / "embeddings"

    @property
    def scratch(self) -> Path:
        """Throw-away working copies (dev selection's scored checkpoints)."""
        return self.root / ".cache"

    # -- hard-negative mining -----------------------------------------------------------------
    @property
    def hard_negatives(self) -> Path:
        """Mined negatives per train query (negatives.parquet, summary.json), or not_used.json."""
        return self.root / "data" / "hard_negatives"

    # -- hierarchy ---------------------------------------------------------------------------
    @property
    def hierarchy(self) -> Path:
        """Corpus tree: centroids per level, document paths, summary stats."""
        return self.root / "models" / "hierarchy"

    # -- training ----------------------------------------------------------------------------
    @property
    def encoder(self) -> Path:
        """Hugging Face model directory (weights + tokenizer) of the trained encoder."""
        return self.root / "models" / "encoder"

    @property
    def final_tree(self) -> Path:
        """The corpus tree after training (HCE's EM re-clustering may have rebuilt it)."""
        return self.root / "models" / "hierarchy_final"

    @property
    def train_report(self) -> Path:
        return self.root / "reports" / "train"

    @property
    def shard_reports(self) -> Path:
        """``<i>.json`` per shard of the encode-corpus stage: its documents and how long they took."""
        return self.root / "reports" / "shards"

    # -- retriever -----------------------------------------------------------------------------
    @property
    def retriever(self) -> Path:
        """The index stage's retriever: manifest.json naming its kind, and the kind's files."""
        return self.root / "models" / "retriever"

    @property
    def retriever_versions(self) -> Path:
        """Versions written by add/edit/remove-documents (v0001, ...) and the CURRENT pointer."""
        return self.root / "models" / "retriever_versions"

    # -- freshness loop ----------------------------------------------------------------------
    @property
    def inbox(self) -> Path:
        """Incoming document batches: drop files here (or ``fresh-retriever submit-documents``)."""
        return self.root / "inbox"

    def incoming_batch(self, batch_id: str) -> Path:
        """An accepted inbox batch's validated documents, rejects and generated queries."""
        return self.root / "data" / "incoming" / batch_id

    @property
    def drift_reports(self) -> Path:
        """One directory per batch: drift statistics, decision, the batch's document embeddings."""
        return self.root / "reports" / "drift"

    @property
    def deployments(self) -> Path:
        """Local copies of registered champions, one per full training, with their index versions."""
        return self.root / "models" / "deployed"

    # -- evaluation / registration -----------------------------------------------------------
    @property
    def eval_report(self) -> Path:
        """metrics.json (DVC metrics), run.trec, per-query metrics and plots."""
        return self.root / "reports" / "eval"

    @property
    def registry_report(self) -> Path:
        return self.root / "reports" / "registry"
