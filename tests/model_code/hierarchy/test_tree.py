"""The corpus tree (``model_code/hierarchy/tree.py``) against independent computations: spherical
k-means as a fixed point of spherical Lloyd iterations over every point, Algorithm 1's next-level
points as the unit-normalised means of the clusters below, node vectors as unit-normalised sums of
their children, and the trees and statistics of corpora too small to cluster, by hand; from the
HCE paper (arXiv 2502.18877), level i's ceil(N / b^i) clusters, Alg. 1 and the divisive builder step
by step, and the tree's statistics; paths, invariants, the paper's branching rule and round trips."""

import math

import faiss
import numpy as np
import pytest

from model_code.hierarchy import tree as tree_module
from model_code.hierarchy.tree import (
    CorpusTree,
    _with_node_vectors,
    auto_branching,
    build_tree,
    spherical_kmeans,
)
from tests.helpers.hce import cluster_tree
from tests.helpers.vectors import unit_rows


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


@pytest.mark.parametrize(("n", "b"), [(7, 2), (10, 3), (50, 4), (130, 5)])
def test_clusters_per_level_are_ceil_n_over_b_to_the_i(n, b):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    tree = build_tree([f"d{i}" for i in range(n)], x, branching=b, niter=10, seed=0)
    depth = math.ceil(math.log(n) / math.log(b) - 1e-9)  # L = ceil(log_b N) levels below the root
    want = [1] + [math.ceil(n / b**i) for i in range(depth - 1, 0, -1)]
    assert tree.stats()["nodes_per_level"] == want
    assert tree.stats()["depth"] == depth


def test_tree_stats_by_hand():
    tree, _ = cluster_tree()  # root -> 2 leaf clusters of 6 and 3 documents
    assert tree.stats() == {"documents": 9, "depth": 2, "nodes_per_level": [1, 2],
                            "fan_out_histogram": {"2": 1, "3": 1, "6": 1}, "leaf_clusters": 2,
                            "largest_leaf_cluster": 6, "smallest_leaf_cluster": 3}
    uneven = CorpusTree(doc_ids=["a", "b", "c"], doc_path=np.array([[0, 0], [0, 1], [1, -1]]),
                        centroids=[np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32)],
                        parents=[np.array([0, 0]), np.array([0, 0])])
    assert uneven.stats() == {"documents": 3, "depth": 3, "nodes_per_level": [1, 2, 2],
                              "fan_out_histogram": {"1": 3, "2": 2}, "leaf_clusters": 3,
                              "largest_leaf_cluster": 1, "smallest_leaf_cluster": 1}


def dense(labels: np.ndarray) -> np.ndarray:
    return np.unique(labels, return_inverse=True)[1]


def test_agglomerative_tree_is_algorithm_1_step_by_step():
    """Alg. 1 recomputed level by level with the same k-means: documents into ceil(N/b) clusters,
    those clusters' normalised mean vectors into ceil(N/b^2), ... up to the root."""
    from model_code.hierarchy.tree import spherical_kmeans

    n, b = 60, 4
    x = np.random.default_rng(5).normal(size=(n, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    tree = build_tree([f"d{i}" for i in range(n)], x, branching=b, niter=6, seed=3)
    points, members, k = x, [np.array([i]) for i in range(n)], math.ceil(n / b)
    for level in range(tree.depth, 0, -1):  # finest level first
        labels = dense(spherical_kmeans(points, k, 6, 3))
        members = [np.concatenate([members[i] for i in np.flatnonzero(labels == c)]) for c in range(labels.max() + 1)]
        for c, docs in enumerate(members):  # every document of cluster c has node c at this level
            assert (tree.doc_path[docs, level - 1] == c).all()
        mean = np.stack([points[labels == c].mean(0) for c in range(labels.max() + 1)])
        points, k = mean / np.linalg.norm(mean, axis=1, keepdims=True), math.ceil(k / b)
    assert k == 1 and len(points) == len(tree.centroids[0])


def test_identical_documents_give_a_tree_without_cluster_levels():
    x = np.tile(np.eye(1, 8, dtype=np.float32), (10, 1))
    tree = build_tree([f"d{i}" for i in range(10)], x, branching=3, niter=4, seed=0)
    assert tree.doc_path.shape == (10, 0) and tree.doc_path.dtype == np.int64 and tree.depth == 0


@pytest.mark.parametrize("identical", [False, True])
def test_divisive_tree_is_top_down_k_means_step_by_step(identical):
    """Every node with more than b documents is split into (up to) b k-means clusters, level by level;
    identical vectors are split evenly; a document whose node is not split ends there (-1 below)."""
    from model_code.hierarchy.tree import spherical_kmeans

    n, b = (40, 3) if not identical else (7, 3)
    x = np.random.default_rng(6).normal(size=(n, 8)).astype(np.float32)
    if identical:
        x[:] = x[0]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    tree = build_tree([f"d{i}" for i in range(n)], x, branching=b, niter=6, seed=2, builder="divisive")
    frontier, level, sizes = [(0, np.arange(n))], 0, []
    while any(len(docs) > b for _, docs in frontier):
        split, count = [], 0
        for node, docs in frontier:
            if len(docs) <= b:
                sizes.append(len(docs))
                continue
            labels = spherical_kmeans(x[docs], b, 6, 2)
            if len(np.unique(labels)) == 1:
                labels = np.arange(len(docs)) % b
            for label in np.unique(labels):
                members = docs[labels == label]
                assert (tree.doc_path[members, level] == count).all() and tree.parents[level][count] == node
                split.append((count, members))
                count += 1
        placed = np.concatenate([m for _, m in split])
        assert (np.delete(tree.doc_path[:, level], placed) == -1).all() and len(tree.parents[level]) == count
        frontier, level = split, level + 1
    assert tree.depth == level
    assert b in sizes + [len(m) for _, m in frontier]  # a node of exactly b documents is not split


@pytest.mark.parametrize("builder", ["agglomerative", "divisive"])
def test_tree_paths_are_consistent(builder):
    centers = unit_rows(8, 16, seed=1)
    points = np.repeat(centers, 25, axis=0) + 0.05 * unit_rows(200, 16, seed=2)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    tree = build_tree([str(i) for i in range(200)], points, branching=4, niter=10, seed=0, builder=builder)
    stats = tree.stats()
    assert stats["documents"] == 200
    if builder == "divisive":
        assert stats["largest_leaf_cluster"] <= 4
    else:  # equal depth ceil(log_4 200) = 4 levels; level i holds ceil(200 / 4^i) nodes (HCE Alg. 1)
        assert stats["depth"] == 4 and stats["nodes_per_level"] == [1, 4, 13, 50]
    for level in range(1, tree.depth):  # a document's node at level l is a child of its node at l-1
        ok = tree.doc_path[:, level] >= 0
        parents = tree.parents[level][tree.doc_path[ok, level]]
        assert np.array_equal(parents, tree.doc_path[ok, level - 1])
    # documents generated around the same centre share their top-level cluster mostly
    top = tree.doc_path[:, 0].reshape(8, 25)
    assert np.mean([np.bincount(row).max() / 25 for row in top]) > 0.9


def test_auto_branching_is_the_papers_rule():
    assert auto_branching(5183) == 32  # SciFact: 32^3 >= 5183 > 16^3
    assert auto_branching(100_000) == 64
    assert auto_branching(8) == 2


def test_tree_round_trips(tmp_path):
    tree = build_tree([f"d{i}" for i in range(50)], unit_rows(50, 8), branching=4, niter=5, seed=0)
    tree.save(tmp_path / "tree.npz")
    loaded = CorpusTree.load(tmp_path / "tree.npz")
    assert loaded.doc_ids == tree.doc_ids and loaded.stats() == tree.stats()
    assert all(np.array_equal(a, b) for a, b in zip(loaded.centroids, tree.centroids))


@pytest.mark.parametrize("builder", ["agglomerative", "divisive"])
def test_tree_invariants(builder):
    vectors = unit_rows(300, 12, seed=4)
    tree = build_tree([f"d{i}" for i in range(300)], vectors, branching=5, niter=8, seed=0, builder=builder)
    # every document exactly once: a path that, once ended, stays ended, through valid node ids
    assert len(tree.doc_ids) == len(set(tree.doc_ids)) == 300
    for level in range(tree.depth):
        column = tree.doc_path[:, level]
        assert column.max() < len(tree.centroids[level])
        if level + 1 < tree.depth:
            assert not ((column < 0) & (tree.doc_path[:, level + 1] >= 0)).any()
    if builder == "agglomerative":  # equal depth ceil(log_5 300) = 4, ceil(300 / 5^i) nodes at level i
        assert tree.stats()["nodes_per_level"] == [1, 3, 12, 60]
    # each node vector is the normalised mean of its direct children (nodes and documents)
    for level in range(tree.depth):
        for node in range(len(tree.centroids[level])):
            children = []
            if level + 1 < tree.depth:
                children += list(tree.centroids[level + 1][tree.parents[level + 1] == node])
            ends = (tree.doc_path[:, level] == node)
            if level + 1 < tree.depth:
                ends &= tree.doc_path[:, level + 1] < 0
            children += list(vectors[ends])
            mean = np.mean(children, axis=0)
            assert np.allclose(tree.centroids[level][node], mean / np.linalg.norm(mean), atol=1e-5)
