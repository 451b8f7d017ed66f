"""The corpus tree (``model_code/hierarchy/tree.py``) against independent computations: spherical
k-means as a fixed point of spherical Lloyd iterations over every point, Algorithm 1's next-level
points as the unit-normalised means of the clusters below, node vectors as unit-normalised sums of
their children, and the trees and statistics of corpora too small to cluster, by hand.
(Clusters per level, Alg. 1 and the divisive builder step by step: ``test_method_hce.py``.)"""

import math

import faiss
import numpy as np
import pytest

from model_code.hierarchy import tree as tree_module
from model_code.hierarchy.tree import _with_node_vectors, build_tree, spherical_kmeans


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def two_unequal_clusters() -> np.ndarray:
    """600 unit vectors in 3-D: a tight cluster around e1 and a broad one around (-0.3, 1, 0)."""
    rng = np.random.default_rng(0)
    tight = np.array([1.0, 0, 0]) + 0.15 * rng.normal(size=(300, 3))
    broad = np.array([-0.3, 1.0, 0]) + 0.9 * rng.normal(size=(300, 3))
    return unit(np.concatenate([tight, broad])).astype(np.float32)


def test_spherical_kmeans_is_a_fixed_point_of_spherical_lloyd_over_every_point():
    """Converged spherical k-means: every point's label is the cluster whose unit-normalised mean
    (over *all* the points with that label) has the largest inner product with it. Euclidean
    k-means (unnormalised centroids, L2 assignment) and k-means trained on a subsample of the
    points (faiss's default above 256 points per centroid) both miss that on these clusters of
    unequal spread (98.8 % and 99.8 % of the points)."""
    x = two_unequal_clusters()
    labels = spherical_kmeans(x, 2, niter=50, seed=1)
    assert sorted(np.unique(labels).tolist()) == [0, 1]
    centroids = unit(np.stack([x[labels == c].astype(np.float64).mean(0) for c in (0, 1)]))
    assert np.array_equal(np.argmax(x @ centroids.T, axis=1), labels)


def test_spherical_kmeans_passes_its_settings_to_faiss(monkeypatch):
    """The settings faiss cannot show on a small CPU run: the given niter and seed, spherical,
    every point trained on (no subsampling below 2^20 points per centroid), quiet, and on all GPUs
    exactly when faiss sees one."""
    seen, real = [], faiss.Kmeans

    class Recording(real):
        def __init__(self, d, k, **kwargs):
            seen.append((d, k, kwargs))
            super().__init__(d, k, **{**kwargs, "gpu": False})

    monkeypatch.setattr(faiss, "Kmeans", Recording)
    x = two_unequal_clusters()[:20]
    for gpus in (0, 1, 2):
        monkeypatch.setattr(faiss, "get_num_gpus", lambda gpus=gpus: gpus)
        spherical_kmeans(x, 3, niter=7, seed=11)
    want = {"niter": 7, "seed": 11, "spherical": True, "min_points_per_centroid": 1,
            "max_points_per_centroid": 1 << 20, "verbose": False}
    assert seen == [(3, 3, {**want, "gpu": gpu}) for gpu in (False, True, True)]
    assert all(type(kwargs["gpu"]) is bool for _, _, kwargs in seen)


def test_spherical_kmeans_on_few_points_per_cluster_prints_nothing(capfd):
    """Deep trees cluster a handful of points per cluster at every level; faiss warns on stderr
    below min_points_per_centroid points per cluster (39 by default) and logs every iteration
    when verbose."""
    x = two_unequal_clusters()[::120]  # 5 points into 3 clusters
    labels = spherical_kmeans(x, 3, niter=5, seed=0)
    assert len(labels) == 5 and set(labels.tolist()) <= {0, 1, 2}
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_agglomerative_levels_cluster_the_unit_normalised_means_of_the_clusters_below(monkeypatch):
    """Alg. 1: level i + 1 clusters the level-i cluster representations, the normalised means of
    their members (spherical k-means centroids), not the raw means."""
    calls, real = [], spherical_kmeans

    def recording(points, k, niter, seed):
        labels = real(points, k, niter, seed)
        calls.append((np.array(points, dtype=np.float64), k, labels))
        return labels

    monkeypatch.setattr(tree_module, "spherical_kmeans", recording)
    rng = np.random.default_rng(3)
    x = unit(rng.normal(size=(40, 6))).astype(np.float32)
    build_tree([f"d{i}" for i in range(40)], x, branching=3, niter=5, seed=0)
    assert [k for _, k, _ in calls] == [math.ceil(40 / 3**i) for i in (1, 2, 3)]  # 14, 5, 2; the root needs none
    (first, _, labels), (second, _, _) = calls[0], calls[1]
    assert np.array_equal(first, x.astype(np.float64))
    dense = np.unique(labels, return_inverse=True)[1]
    means = np.stack([x[dense == c].astype(np.float64).mean(0) for c in range(dense.max() + 1)])
    assert np.allclose(second, means / np.linalg.norm(means, axis=1, keepdims=True), atol=1e-6)
    assert (np.linalg.norm(means, axis=1) < 0.99).any()  # so a missing normalisation would show


def test_a_node_vector_is_the_unit_normalised_sum_of_children_that_nearly_cancel():
    """Two documents (1, 0) and (-0.8, 0.6) under one node: their sum (0.2, 0.6) has norm
    sqrt(0.4) < 1, and the node vector is (0.2, 0.6) / sqrt(0.4)."""
    x = np.array([[1.0, 0.0], [-0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
    tree = _with_node_vectors(["a", "b", "c"], np.array([[0], [0], [1]]), [np.array([0, 0])], x)
    assert np.allclose(tree.centroids[0], [[0.2 / math.sqrt(0.4), 0.6 / math.sqrt(0.4)], [0.0, 1.0]], atol=1e-6)
    assert tree.centroids[0].dtype == np.float32


@pytest.mark.parametrize("builder", ["agglomerative", "divisive"])
def test_a_corpus_of_at_most_b_documents_is_a_root_over_its_documents(builder):
    """N <= b: every document sits directly under the root (agglomerative: ceil(N/b) = 1 cluster
    is the root itself; divisive: the root is not split). No cluster level, so by hand: depth 1,
    one leaf cluster (the root) of N documents."""
    x = two_unequal_clusters()[[0, 299, 300, 599]]
    tree = build_tree(["a", "b", "c", "d"], x, branching=4, niter=5, seed=0, builder=builder)
    assert tree.doc_path.shape == (4, 0) and tree.doc_path.dtype == np.int64
    assert tree.depth == 0 and tree.centroids == [] and tree.parents == []
    assert tree.stats() == {"documents": 4, "depth": 1, "nodes_per_level": [1], "fan_out_histogram": {"4": 1},
                            "leaf_clusters": 1, "largest_leaf_cluster": 4, "smallest_leaf_cluster": 4}


def test_an_unknown_builder_is_named_in_the_error():
    with pytest.raises(ValueError) as error:
        build_tree(["a", "b"], np.eye(2, dtype=np.float32), branching=2, niter=1, seed=0, builder="bottom-up")
    assert str(error.value) == "unknown hierarchy builder 'bottom-up' (use ['agglomerative', 'divisive'])"
