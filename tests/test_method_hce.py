"""HCE checked against hand computations written from the paper (arXiv 2502.18877), not from the code.

Eq. 5 (levels t <= M): -log softmax over the positive node and its siblings of <q, c>/tau.
Eq. 8 (levels t > M): query->document over the in-batch documents and the sampled negatives,
plus document->query over the in-batch queries only; no 1/2.
Eq. 6: the levels' losses are summed. Alg. 1: level i has ceil(N / b^i) clusters.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model_code.hierarchy.tree import CorpusTree, build_tree
from model_code.losses.contrastive import bidirectional_infonce
from model_code.losses.hierarchical import HCELoss

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


@pytest.fixture
def small():
    """Six documents in two leaf clusters {0,1,2}, {3,4,5} under one root; a batch of three pairs
    whose positives are documents 0, 3 and 4, each with two sampled negatives (one masked)."""
    g = torch.Generator().manual_seed(0)
    tree = CorpusTree(doc_ids=[f"d{i}" for i in range(6)], doc_path=np.array([[0], [0], [0], [1], [1], [1]]),
                      centroids=[np.array([[1.0, 0.5, 0.0], [-0.5, 1.0, 2.0]], dtype=np.float32)],
                      parents=[np.array([0, 0])])
    q = F.normalize(torch.randn(3, 3, generator=g, dtype=torch.float64), dim=-1)
    p = F.normalize(torch.randn(3, 3, generator=g, dtype=torch.float64), dim=-1)
    negatives = F.normalize(torch.randn(3, 2, 2, 3, generator=g, dtype=torch.float64), dim=-1)  # (B, levels, k, d)
    mask = torch.tensor([[[True, True], [True, False]], [[False, True], [True, True]], [[True, True], [True, True]]])
    return tree, q, p, torch.tensor([0, 3, 4]), negatives, mask


def test_eq8_sampled_negatives_on_the_query_side_only(small):
    _, q, p, _, negatives, mask = small
    got = bidirectional_infonce(q, p, TAU, extra=negatives[:, 0], extra_mask=mask[:, 0])
    want = eq8(q.tolist(), p.tolist(), negatives[:, 0].tolist(), mask[:, 0].tolist())
    assert float(got) == pytest.approx(want, rel=1e-10)
    assert float(bidirectional_infonce(q, p, TAU)) == pytest.approx(eq8(q.tolist(), p.tolist()), rel=1e-10)


def test_hce_loss_is_eq5_plus_eq8(small):
    tree, q, p, docs, negatives, mask = small
    loss = HCELoss(tree, levels_trained=1, temperature=TAU, n_negatives=2).double()
    assert loss.contrastive_levels == [1]
    total, parts = loss(q, p, docs, negatives[:, 1:], mask[:, 1:])
    total = total.detach()
    hierarchy = eq5(q.tolist(), tree.centroids[0].tolist(), [0, 1, 1])
    contrastive = eq8(q.tolist(), p.tolist(), negatives[:, 1].tolist(), mask[:, 1].tolist())
    assert float(total) == pytest.approx(hierarchy + contrastive, rel=1e-9)
    assert parts == pytest.approx({"level_1": hierarchy, "level_2": contrastive}, rel=1e-9)
    weighted = HCELoss(tree, 1, TAU, 2, hierarchy_weight=0.3, contrastive_weight=2.0).double()
    total, _ = weighted(q, p, docs, negatives[:, 1:], mask[:, 1:])
    assert float(total.detach()) == pytest.approx(0.3 * hierarchy + 2.0 * contrastive, rel=1e-9)


def test_levels_are_summed_not_averaged(small):
    """M = 0: two contrastive levels, negatives from the root's subtree and from the leaf cluster."""
    tree, q, p, docs, negatives, mask = small
    loss = HCELoss(tree, levels_trained=0, temperature=TAU, n_negatives=2).double()
    total, parts = loss(q, p, docs, negatives, mask)
    levels = [eq8(q.tolist(), p.tolist(), negatives[:, t].tolist(), mask[:, t].tolist()) for t in (0, 1)]
    assert float(total) == pytest.approx(sum(levels), rel=1e-10)
    assert list(parts.values()) == pytest.approx(levels, rel=1e-10)


def test_without_hierarchy_terms_it_is_l_times_the_hand_computed_in_batch_loss(small):
    tree, q, p, docs, _, _ = small
    loss = HCELoss(tree, levels_trained=0, temperature=TAU, n_negatives=0).double()
    index, mask = loss.sample_negatives(docs, torch.Generator())
    assert index.shape == (3, 2, 0)
    total, _ = loss(q, p, docs, torch.zeros(3, 2, 0, 3, dtype=torch.float64), mask)
    assert float(total) == pytest.approx(2 * eq8(q.tolist(), p.tolist()), rel=1e-10)


def cluster_tree():
    """Nine documents: a leaf cluster of six (0-5) and one of three (6-8)."""
    x = np.eye(9, dtype=np.float32)
    return CorpusTree(doc_ids=[f"d{i}" for i in range(9)], doc_path=np.array([[0]] * 6 + [[1]] * 3),
                      centroids=[np.eye(2, 9, dtype=np.float32)], parents=[np.array([0, 0])]), x


def test_sampled_negatives_are_distinct_documents_of_the_leaf_cluster():
    tree, _ = cluster_tree()
    loss = HCELoss(tree, levels_trained=1, n_negatives=4)
    generator = torch.Generator().manual_seed(0)
    docs = torch.arange(9)
    counts = np.zeros((9, 9))
    for _ in range(300):
        index, valid = loss.sample_negatives(docs, generator)
        for d in range(9):
            picked = index[d, 0][valid[d, 0]].tolist()
            assert len(picked) == len(set(picked)), "a negative drawn twice"
            cluster = set(range(6)) if d < 6 else {6, 7, 8}
            assert set(picked) <= cluster - {d}
            assert len(picked) == min(4, len(cluster) - 1)  # the small cluster gives all it has
            counts[d, picked] += 1
    for d in range(6):  # uniform over the 5 others: 300 * 4/5 = 240 each
        others = [o for o in range(6) if o != d]
        assert (np.abs(counts[d, others] - 240) < 40).all(), counts[d]


def test_root_level_negatives_are_distinct_and_from_the_whole_corpus():
    tree, _ = cluster_tree()
    loss = HCELoss(tree, levels_trained=0, n_negatives=8)
    index, valid = loss.sample_negatives(torch.arange(9), torch.Generator().manual_seed(1))
    for d in range(9):
        picked = index[d, 0][valid[d, 0]].tolist()
        assert sorted(picked) == [o for o in range(9) if o != d]  # 8 of 8 others: every one, once


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


class TableEncoder:
    """An "encoder" that looks texts up in a table of vectors (tokenize passes texts through)."""

    device = torch.device("cpu")

    def __init__(self, table: dict[str, torch.Tensor]):
        self.table = table

    def tokenize(self, texts, length):
        return list(texts)

    def __call__(self, texts):
        return torch.stack([self.table[t] for t in texts])


def test_objective_weighs_streams_and_gives_the_tree_terms_to_hierarchical_streams_only(small):
    """J = L_S + alpha * L_U (Eq. 7): a hierarchical stream gets Eq. 5 + Eq. 8 with its sampled
    negatives (taken from the cache), a plain stream Eq. 8 alone, with a query's other relevant
    document left out of its negatives."""
    import itertools

    import pandas as pd

    from model_code.training.objectives import HCEObjective, Stream
    from model_code.training.pairs import with_positives

    tree, _, _, _, _, _ = small
    g = torch.Generator().manual_seed(4)
    cache = F.normalize(torch.randn(6, 3, generator=g, dtype=torch.float64), dim=-1)
    passages = [f"text of d{i}" for i in range(6)]
    queries = ["qa", "qb", "qc", "qa"]  # "qa" is relevant to d0 and d5
    table = {t: F.normalize(torch.randn(3, generator=g, dtype=torch.float64), dim=0) for t in passages + queries[:3]}
    supervised = with_positives(pd.DataFrame({"query": queries[:3], "doc_id": ["d0", "d3", "d4"]}))
    unsupervised = with_positives(pd.DataFrame({"query": queries, "doc_id": ["d0", "d1", "d3", "d5"]}))
    loss = HCELoss(tree, levels_trained=1, temperature=TAU, n_negatives=2).double()
    streams = [Stream("supervised", itertools.repeat(supervised), 1.0, hierarchical=True),
               Stream("unsupervised", itertools.repeat(unsupervised), 0.3, hierarchical=False)]
    objective = HCEObjective(TableEncoder(table), loss, streams, tree.doc_ids, passages, cache, False, 8, 8,
                             torch.Generator().manual_seed(9))
    total, parts = objective()

    index, valid = loss.sample_negatives(torch.tensor([0, 3, 4]), torch.Generator().manual_seed(9))
    q = [table[t].tolist() for t in queries[:3]]
    p = [table[passages[d]].tolist() for d in (0, 3, 4)]
    supervised_loss = (eq5(q, tree.centroids[0].tolist(), [0, 1, 1])
                       + eq8(q, p, cache[index[:, 0]].tolist(), valid[:, 0].tolist()))
    # unsupervised: rows 0 and 3 share query "qa", so d5 is not a negative of row 0 nor d0 of row 3
    qu = [table[t].tolist() for t in queries]
    pu = [table[passages[d]].tolist() for d in (0, 1, 3, 5)]
    shared = {(0, 3), (3, 0)}
    forward = sum(neg_log_softmax(dot(qu[i], pu[i]) / TAU, [dot(qu[i], pu[j]) / TAU for j in range(4)
                                                             if j != i and (i, j) not in shared]) for i in range(4)) / 4
    backward = sum(neg_log_softmax(dot(pu[i], qu[i]) / TAU, [dot(pu[i], qu[j]) / TAU for j in range(4)
                                                              if j != i and (j, i) not in shared]) for i in range(4)) / 4
    assert float(total.detach()) == pytest.approx(supervised_loss + 0.3 * (forward + backward), rel=1e-9)
    assert set(parts) == {"supervised.level_1", "supervised.level_2", "unsupervised"}
    assert parts["unsupervised"] == pytest.approx(forward + backward, rel=1e-9)


def test_eq8_for_one_ranks_rows_against_the_global_batch():
    """Rows 2-3 of a global batch of 4 (offset 2, as on rank 1 of 2): each local query against all
    four passages plus its one sampled negative, each local passage against all four queries;
    queries 0 and 2 share a relevant pair, left out of both directions."""
    g = torch.Generator().manual_seed(2)
    q = F.normalize(torch.randn(4, 3, generator=g, dtype=torch.float64), dim=-1)
    p = F.normalize(torch.randn(4, 3, generator=g, dtype=torch.float64), dim=-1)
    extra = F.normalize(torch.randn(2, 1, 3, generator=g, dtype=torch.float64), dim=-1)
    known = torch.zeros(4, 4, dtype=torch.bool)
    known[0, 2] = known[2, 0] = True
    got = bidirectional_infonce(q[2:], p[2:], TAU, all_queries=q, all_passages=p, offset=2, extra=extra,
                                extra_mask=torch.ones(2, 1, dtype=torch.bool), false_negatives=known)
    Q, P, X = q.tolist(), p.tolist(), extra[:, 0].tolist()
    forward = [neg_log_softmax(dot(Q[i], P[i]) / TAU, [dot(Q[i], P[j]) / TAU for j in range(4) if j != i
                                                        and not known[i, j]] + [dot(Q[i], X[i - 2]) / TAU])
               for i in (2, 3)]
    backward = [neg_log_softmax(dot(P[i], Q[i]) / TAU, [dot(P[i], Q[j]) / TAU for j in range(4) if j != i
                                                         and not known[j, i]]) for i in (2, 3)]
    assert float(got) == pytest.approx(sum(forward) / 2 + sum(backward) / 2, rel=1e-10)


def test_the_in_batch_loss_runs_on_the_embeddings_device():
    """CPU masks meet embeddings on another device (meta stands in for a GPU, rejecting CPU operands)."""
    q, p = torch.empty(3, 4, device="meta"), torch.empty(3, 4, device="meta")
    loss = bidirectional_infonce(q, p, TAU, extra=torch.empty(3, 2, 4, device="meta"),
                                 extra_mask=torch.ones(3, 2, dtype=torch.bool),
                                 false_negatives=torch.zeros(3, 3, dtype=torch.bool))
    assert loss.device.type == "meta"
