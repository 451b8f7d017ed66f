"""Drift statistics and the decision rule (``model_code/freshness/drift.py``): population stability and
KS separate shifted vectors from in-distribution ones, and the thresholds decide between an incremental
update and a retrain."""

import numpy as np

from model_code.config import DriftThresholds
from model_code.freshness.drift import decide, embedding_drift, population_stability


def test_population_stability_and_ks_separate_shifted_vectors():
    from model_code.freshness.drift import DriftReference

    rng = np.random.default_rng(0)
    centroids = np.eye(4, 16, dtype=np.float32)

    def around(rows, cluster, noise):
        v = centroids[cluster] + noise * rng.normal(size=(rows, 16))
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    train = np.concatenate([around(100, c, 0.2) for c in range(4)])
    similarity = (train @ centroids.T).max(axis=1)
    reference = DriftReference(centroids=centroids, train_similarity=similarity, train_share=np.full(4, 0.25),
                               base_ids=[], canary_qrels={}, canary_vectors=np.zeros((0, 16)), canary_at_training={})
    same = embedding_drift(reference, np.concatenate([around(10, c, 0.2) for c in range(4)]))
    far = embedding_drift(reference, around(40, 0, 3.0))  # far from every centroid: a new topic
    one_cluster = embedding_drift(reference, around(40, 0, 0.2))  # in distribution, but all one topic
    assert same["similarity_ks"] < 0.35 and same["cluster_psi"] < 0.1
    assert far["similarity_ks"] > 0.9 and far["mean_similarity"] < 0.5 < same["mean_similarity"]
    assert one_cluster["cluster_psi"] > 0.5 and one_cluster["similarity_ks"] < 0.35
    assert population_stability(np.full(4, 0.25), np.array([0, 0, 0])) > 0  # finite with empty clusters


def stats(**overrides):
    base = {"batch_documents": 50, "added_since_training": 100, "volume_ratio": 0.02, "canary_mrr_drop": 0.0,
            "unseparable_share": 0.0, "batch_similarity_ks": 0.1, "batch_cluster_psi": 0.05,
            "cumulative_similarity_ks": 0.1, "cumulative_cluster_psi": 0.05}
    return {**base, **overrides}


def test_decide_thresholds():
    thresholds = DriftThresholds()
    assert decide(stats(), thresholds, 5) == ("incremental", [])
    action, reasons = decide(stats(volume_ratio=0.3, batch_similarity_ks=0.9), thresholds, 5)
    assert action == "retrain" and len(reasons) == 2 and reasons[0].startswith("volume_ratio 0.3000 > 0.25")
    assert decide(stats(canary_mrr_drop=thresholds.max_canary_mrr_drop + 0.01), thresholds, 5)[0] == "retrain"
    assert decide(stats(unseparable_share=0.5), thresholds, 5)[0] == "retrain"
    # a 3-document batch is too small for its own KS/PSI to count, and so is a 3-document total
    small = stats(batch_documents=3, added_since_training=3, batch_similarity_ks=1.0, cumulative_cluster_psi=9.0)
    assert decide(small, thresholds, 5) == ("incremental", [])
