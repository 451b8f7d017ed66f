"""Corpus tree by spherical k-means (HCE Algorithms 1-2), and its on-disk artifact.

Two builders, one artifact format:

* ``agglomerative`` (the HCE paper's Algorithm 1): cluster the N documents into ceil(N/b)
  clusters, then those centroids into ceil(N/b^2), ... until one root, so every document sits at
  the same depth L = ceil(log_b N). Cost grows like O(N^2 d / b).
* ``divisive`` (the scalable route the paper's Limitations section names for >100M documents;
  its §4 chooses agglomerative on purpose, for equal depth): split the root into b
  clusters and recurse into every node holding more than b documents. Cost O(N d b log N);
  documents may sit at different depths.

k-means is faiss spherical k-means (``stores.faiss_store``, on GPU when faiss-gpu and CUDA are present), seeded. A
document's path is the node id it belongs to at each level. A node's vector is the L2-normalised
mean of its direct children (child nodes' vectors, and documents directly under it), as the
spherical k-means centroid of each agglomerative step is.

Artifact (``tree.npz``): ``doc_path`` (N x depth, -1 below a document's leaf cluster) and, per
level l >= 1, ``centroids_<l>`` and ``parent_<l>`` (node index at level l-1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model_code.stores.faiss_store import spherical_kmeans


@dataclass
class CorpusTree:
    doc_ids: list[str]
    doc_path: np.ndarray  # (N, depth) int64, node id per level, -1 where the path has ended
    centroids: list[np.ndarray]  # per level 1..depth: (n_nodes, d)
    parents: list[np.ndarray]  # per level 1..depth: (n_nodes,) index of the parent one level up

    @property
    def depth(self) -> int:
        return len(self.centroids)

    def stats(self) -> dict:
        leaf_sizes = Counter()
        for row in self.doc_path:
            ended = np.flatnonzero(row < 0)
            level = (ended[0] if len(ended) else len(row)) - 1
            leaf_sizes[(level, int(row[level]) if level >= 0 else 0)] += 1
        fan_out = Counter()
        for level, parent in enumerate(self.parents):
            fan_out.update(Counter(parent.tolist()).values())
        fan_out.update(leaf_sizes.values())
        sizes = list(leaf_sizes.values())
        return {
            "documents": len(self.doc_ids),
            "depth": self.depth + 1,  # + the document level
            "nodes_per_level": [1] + [len(c) for c in self.centroids],
            "fan_out_histogram": {str(k): v for k, v in sorted(fan_out.items())},
            "leaf_clusters": len(sizes),
            "largest_leaf_cluster": max(sizes),
            "smallest_leaf_cluster": min(sizes),
        }

    def save(self, path: str | Path) -> None:
        arrays = {"doc_path": self.doc_path, "doc_ids": np.array(self.doc_ids, dtype=object)}
        for level, (centroids, parent) in enumerate(zip(self.centroids, self.parents), start=1):
            arrays[f"centroids_{level}"] = centroids
            arrays[f"parent_{level}"] = parent
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> CorpusTree:
        with np.load(path, allow_pickle=True) as data:
            depth = data["doc_path"].shape[1]
            return cls(
                doc_ids=data["doc_ids"].tolist(),
                doc_path=data["doc_path"],
                centroids=[data[f"centroids_{level}"] for level in range(1, depth + 1)],
                parents=[data[f"parent_{level}"] for level in range(1, depth + 1)],
            )


def _normalised_mean(vectors: np.ndarray) -> np.ndarray:
    mean = vectors.mean(axis=0)
    return mean / max(np.linalg.norm(mean), 1e-12)


def auto_branching(n_documents: int, max_depth: int = 3) -> int:
    """The HCE paper's BEIR rule: the smallest power of two with ceil(log_b N) <= ``max_depth``."""
    b = 2
    while b**max_depth < n_documents:
        b *= 2
    return b


def build_tree(
    doc_ids: list[str], embeddings: np.ndarray, branching: int, niter: int, seed: int, builder: str = "agglomerative"
) -> CorpusTree:
    builders = {"agglomerative": build_agglomerative, "divisive": build_divisive}
    if builder not in builders:
        raise ValueError(f"unknown hierarchy builder {builder!r} (use {sorted(builders)})")
    return builders[builder](list(doc_ids), embeddings, branching, niter, seed)


def build_agglomerative(doc_ids: list[str], embeddings: np.ndarray, branching: int, niter: int, seed: int) -> CorpusTree:
    """Bottom-up: documents -> ceil(N/b) clusters -> ceil(N/b^2) -> ... -> root."""
    n = len(doc_ids)
    assignments = []  # finest first: cluster id of each item of the level below
    points, k = embeddings, -(-n // branching)  # level i: ceil(N / b^i) = ceil(ceil(N / b^(i-1)) / b)
    while len(points) > 1 and k >= 1:
        k = min(k, len(points))  # fewer points than k only after k-means left a cluster empty
        labels = spherical_kmeans(points, k, niter, seed) if k > 1 else np.zeros(len(points), dtype=np.int64)
        _, labels = np.unique(labels, return_inverse=True)  # drop empty clusters, keep ids dense
        assignments.append(labels)
        if k == 1:
            break
        points = np.stack([_normalised_mean(points[labels == c]) for c in range(labels.max() + 1)])
        k = -(-k // branching)
    # document -> node id per level, finest level first, then flipped to root-first order
    columns, current = [], np.arange(n)
    for labels in assignments:
        current = labels[current]
        columns.append(current)
    columns = columns[:-1][::-1]  # drop the root level (a single node), order root -> leaves
    parents = []
    for level, column in enumerate(columns):
        parent = np.zeros(column.max() + 1, dtype=np.int64)
        if level > 0:
            parent[column] = columns[level - 1]
        parents.append(parent)
    doc_path = np.stack(columns, axis=1).astype(np.int64) if columns else np.zeros((n, 0), dtype=np.int64)
    return _with_node_vectors(doc_ids, doc_path, parents, embeddings)


def build_divisive(doc_ids: list[str], embeddings: np.ndarray, branching: int, niter: int, seed: int) -> CorpusTree:
    """Top-down: split every node holding more than b documents into b clusters."""
    n = len(doc_ids)
    frontier = [(0, np.arange(n))]
    columns, parents = [], []
    while any(len(docs) > branching for _, docs in frontier):
        column = np.full(n, -1, dtype=np.int64)
        level_parents, next_frontier = [], []
        for node, docs in frontier:
            if len(docs) <= branching:
                continue
            labels = spherical_kmeans(embeddings[docs], branching, niter, seed)
            if len(np.unique(labels)) == 1:  # identical vectors: split evenly so recursion ends
                labels = np.arange(len(docs)) % branching
            for label in np.unique(labels):
                members = docs[labels == label]
                column[members] = len(level_parents)
                next_frontier.append((len(level_parents), members))
                level_parents.append(node)
        columns.append(column)
        parents.append(np.array(level_parents, dtype=np.int64))
        frontier = next_frontier
    doc_path = np.stack(columns, axis=1) if columns else np.zeros((n, 0), dtype=np.int64)
    return _with_node_vectors(doc_ids, doc_path, parents, embeddings)


def _with_node_vectors(
    doc_ids: list[str], doc_path: np.ndarray, parents: list[np.ndarray], embeddings: np.ndarray
) -> CorpusTree:
    """Compute node vectors bottom-up: normalised mean of each node's direct children."""
    depth = len(parents)
    centroids: list[np.ndarray] = [np.empty(0)] * depth
    for level in reversed(range(depth)):
        sums = np.zeros((len(parents[level]), embeddings.shape[1]), dtype=np.float64)
        ends_here = doc_path[:, level] >= 0
        if level + 1 < depth:
            ends_here &= doc_path[:, level + 1] < 0
            np.add.at(sums, parents[level + 1], centroids[level + 1])
        np.add.at(sums, doc_path[ends_here, level], embeddings[ends_here])
        centroids[level] = (sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    return CorpusTree(doc_ids=list(doc_ids), doc_path=doc_path, centroids=centroids, parents=parents)
