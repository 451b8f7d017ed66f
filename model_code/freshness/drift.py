"""How far incoming documents drift from what the deployed retriever was trained on, and the
decision that follows: apply the batch incrementally, or retrain from scratch.

The reference is the deployed model's *training snapshot*: the vectors of the documents in its
base index (read back from FAISS, never re-encoded), the top level of the corpus tree built from
them by the configured hierarchy builder (the champion's own hierarchy, with its own encoder),
and a fixed canary set of old documents' queries from the decision split (``registry.decision_split``,
dev by default: the canary steers decisions, so it never reads test) with their metrics at training
time.

Per batch and cumulatively since the snapshot:

1. volume: documents added since the training / documents trained on;
2. embedding drift: two-sample Kolmogorov-Smirnov statistic between the new and the training
   documents' cosine to their nearest top-level centroid (new topics sit far from every
   centroid), and the population-stability index of their top-level cluster assignments;
3. retrieval health: canary MRR@10 / Hits@10 on the index *with the batch added*, against the
   value at training time (new documents must not crowd out old answers);
4. IncDSI health: share of added documents whose constraints could not all be met.

``decide`` is a pure function of these statistics and ``freshness.thresholds``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import ks_2samp

from model_code.config import DriftThresholds, FreshnessParams, HierarchyParams
from model_code.data.ingested import IngestedData
from model_code.eval.metrics import evaluate, hits_to_run, qrels_dict, search_depth
from model_code.hierarchy.tree import build_tree
from model_code.io import atomic_path
from model_code.stores import VectorStore

CANARY_METRICS = ["mrr@10", "hit_rate@10"]


@dataclass
class DriftReference:
    centroids: np.ndarray  # (k, d) top-level node vectors of the training snapshot's tree
    train_similarity: np.ndarray  # each training document's cosine to its nearest top centroid
    train_share: np.ndarray  # (k,) share of training documents per top-level cluster
    base_ids: list[str]  # documents trained on
    canary_qrels: dict[str, dict[str, int]]
    canary_vectors: np.ndarray  # canary query embeddings, row order = sorted(canary_qrels)
    canary_at_training: dict[str, float]
    ignore_identical_ids: bool = True  # eval.ignore_identical_ids when the reference was built

    def save(self, directory: Path) -> None:
        with atomic_path(directory) as out:
            out.mkdir()
            np.savez(out / "arrays.npz", centroids=self.centroids, train_similarity=self.train_similarity,
                     train_share=self.train_share, canary_vectors=self.canary_vectors)
            meta = {"base_ids": self.base_ids, "canary_qrels": self.canary_qrels,
                    "canary_at_training": self.canary_at_training, "ignore_identical_ids": self.ignore_identical_ids}
            (out / "reference.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, directory: Path) -> DriftReference:
        meta = json.loads((directory / "reference.json").read_text())
        with np.load(directory / "arrays.npz") as arrays:
            return cls(**{k: arrays[k] for k in arrays.files}, **meta)


def nearest_centroid(vectors: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosine to the nearest centroid, its index) per row of L2-normalised ``vectors``."""
    similarity = vectors @ centroids.T
    return similarity.max(axis=1), similarity.argmax(axis=1)


def canary_evaluation(index: VectorStore, reference: DriftReference) -> tuple[dict[str, float], pd.DataFrame]:
    """The canary's mean metrics on ``index`` and its per-query table (one row per canary query)."""
    scores, ids = index.search(reference.canary_vectors, search_depth(10, reference.ignore_identical_ids))
    run = hits_to_run(sorted(reference.canary_qrels), ids, scores, 10, reference.ignore_identical_ids)
    return evaluate(reference.canary_qrels, run, CANARY_METRICS)


def canary_metrics(index: VectorStore, reference: DriftReference) -> dict[str, float]:
    return canary_evaluation(index, reference)[0]


def build_reference(
    index: VectorStore, encode_queries, data: IngestedData, hierarchy: HierarchyParams, params: FreshnessParams,
    ignore_identical_ids: bool = True, split: str = "dev",
) -> DriftReference:
    """Snapshot of the deployed index; ``encode_queries(texts)`` embeds the canary queries."""
    base_ids = index.live_ids()
    vectors = index.vectors(base_ids)
    tree = build_tree(base_ids, vectors, hierarchy.branching_for(len(base_ids)), hierarchy.niter, hierarchy.seed,
                      hierarchy.builder)
    centroids = tree.centroids[0]
    similarity, cluster = nearest_centroid(vectors, centroids)
    share = np.bincount(cluster, minlength=len(centroids)) / len(cluster)

    indexed = set(base_ids)
    qrels = data.qrels_for(split)  # the decision split: the canary decides too, so never test
    answerable = qrels.groupby("query_id")["doc_id"].agg(lambda ids: set(ids) <= indexed)
    relevant = set(qrels.loc[qrels["relevance"] > 0, "query_id"])  # a query judged only not relevant scores 0 always
    candidates = sorted(q for q in answerable[answerable].index if q in relevant)
    rng = np.random.default_rng(params.seed)
    chosen = sorted(rng.choice(candidates, size=min(params.canary_queries, len(candidates)), replace=False).tolist())
    canary_qrels = qrels_dict(qrels[qrels["query_id"].isin(chosen)])
    texts = data.queries.set_index("query_id").loc[chosen, "text"].tolist()
    reference = DriftReference(
        centroids=centroids, train_similarity=similarity, train_share=share, base_ids=base_ids,
        canary_qrels=canary_qrels, canary_vectors=np.asarray(encode_queries(texts), dtype=np.float32),
        canary_at_training={}, ignore_identical_ids=ignore_identical_ids,
    )
    reference.canary_at_training = canary_metrics(index, reference)
    return reference


def population_stability(share: np.ndarray, clusters: np.ndarray) -> float:
    """PSI of ``clusters`` against the reference ``share``, with add-half smoothing of the counts
    so that a small batch missing a cluster does not produce an infinite value."""
    k = len(share)
    observed = (np.bincount(clusters, minlength=k) + 0.5) / (len(clusters) + 0.5 * k)
    expected = np.clip(share, 1e-4, None)
    return float(np.sum((observed - expected) * np.log(observed / expected)))


def embedding_drift(reference: DriftReference, vectors: np.ndarray) -> dict[str, float]:
    similarity, cluster = nearest_centroid(vectors, reference.centroids)
    return {
        "similarity_ks": float(ks_2samp(similarity, reference.train_similarity).statistic),
        "cluster_psi": population_stability(reference.train_share, cluster),
        "mean_similarity": float(similarity.mean()),
    }


def volume_statistics(batch_documents: int, added_since_training: int, trained_documents: int) -> dict[str, float]:
    """Document counts: what every retriever kind can be judged on."""
    return {"batch_documents": batch_documents, "added_since_training": added_since_training,
            "trained_documents": trained_documents, "volume_ratio": added_since_training / trained_documents}


def vector_statistics(
    reference: DriftReference,
    batch_vectors: np.ndarray,
    cumulative_vectors: np.ndarray,
    index_after: VectorStore,
) -> dict[str, float]:
    """Embedding drift and canary health of one batch; ``cumulative_vectors`` are every document
    added since the training snapshot, this batch included, and ``index_after`` holds them all."""
    stats = {"train_mean_similarity": float(reference.train_similarity.mean())}
    stats.update({f"batch_{k}": v for k, v in embedding_drift(reference, batch_vectors).items()})
    stats.update({f"cumulative_{k}": v for k, v in embedding_drift(reference, cumulative_vectors).items()})
    after = canary_metrics(index_after, reference)
    for metric in CANARY_METRICS:
        stats[f"canary_{metric}_at_training"] = reference.canary_at_training[metric]
        stats[f"canary_{metric}"] = after[metric]
    stats["canary_mrr_drop"] = reference.canary_at_training["mrr@10"] - after["mrr@10"]
    return stats


def decide(stats: dict[str, float], thresholds: DriftThresholds, min_batch_documents: int) -> tuple[str, list[str]]:
    """``("incremental", [])`` or ``("retrain", reasons)``; every tripped threshold is a reason.
    Per-batch embedding statistics count only for batches of at least ``min_batch_documents``
    (a KS or PSI over three documents says nothing); the same holds for the cumulative ones.
    Statistics a retriever kind cannot compute (absent from ``stats``) are not checked."""
    checks = [
        ("volume_ratio", thresholds.max_volume_ratio),
        ("canary_mrr_drop", thresholds.max_canary_mrr_drop),
        ("unseparable_share", thresholds.max_unseparable_share),
    ]
    for scope, size in (("batch", stats["batch_documents"]), ("cumulative", stats["added_since_training"])):
        if size >= min_batch_documents:
            checks += [(f"{scope}_similarity_ks", thresholds.max_similarity_ks),
                       (f"{scope}_cluster_psi", thresholds.max_cluster_psi)]
    reasons = [f"{name} {stats[name]:.4f} > {limit}" for name, limit in checks if stats.get(name, 0.0) > limit]
    return ("retrain" if reasons else "incremental"), reasons


def index_with(index: VectorStore, vectors: np.ndarray, doc_ids: list[str]) -> VectorStore:
    """A copy of ``index`` with ``vectors`` added (the deployed index is left untouched)."""
    copy = index.copy()
    copy.add(vectors, doc_ids)
    return copy
