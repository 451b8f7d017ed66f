"""HCE's terms computed by hand from the paper (arXiv 2502.18877), not from the code, on Python lists:
Eq. 5 (level 1: a softmax over the level's nodes), Eq. 8 (query->document over the in-batch documents and
the sampled negatives, plus document->query over the in-batch queries only), and a small corpus tree."""

import math

import numpy as np

from model_code.hierarchy.tree import CorpusTree

TAU = 0.5


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def neg_log_softmax(target: float, others: list[float]) -> float:
    """-log(exp(target) / (exp(target) + sum exp(others)))."""
    return -target + math.log(math.exp(target) + sum(math.exp(o) for o in others))


def eq8(q, p, extra=(), valid=()):
    """Eq. 8 by hand, lists of vectors: rows i of q/p pair up; extra[i] are query i's sampled
    negatives (used where valid[i][k]); mean over the batch in each direction, the two summed."""
    b = len(q)
    forward = sum(
        neg_log_softmax(dot(q[i], p[i]) / TAU,
                        [dot(q[i], p[j]) / TAU for j in range(b) if j != i]
                        + [dot(q[i], n) / TAU for n, ok in zip(extra[i] if extra else [], valid[i] if valid else []) if ok])
        for i in range(b)) / b
    backward = sum(neg_log_softmax(dot(p[i], q[i]) / TAU, [dot(p[i], q[j]) / TAU for j in range(b) if j != i])
                   for i in range(b)) / b
    return forward + backward


def eq5(q, centroids, targets):
    """Eq. 5 at level 1 by hand: softmax over all level-1 nodes (all children of the root)."""
    unit = [[x / math.sqrt(dot(c, c)) for x in c] for c in centroids]
    return sum(neg_log_softmax(dot(qi, unit[t]) / TAU, [dot(qi, u) / TAU for k, u in enumerate(unit) if k != t])
               for qi, t in zip(q, targets)) / len(q)


def cluster_tree():
    """Nine documents: a leaf cluster of six (0-5) and one of three (6-8)."""
    x = np.eye(9, dtype=np.float32)
    return CorpusTree(doc_ids=[f"d{i}" for i in range(9)], doc_path=np.array([[0]] * 6 + [[1]] * 3),
                      centroids=[np.eye(2, 9, dtype=np.float32)], parents=[np.array([0, 0])]), x
