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
from model_code.methods.hce.loss import HCELoss

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
    same = 0  # rows draw independently: documents 2 and 3 skip different selves, positions agree 1 time in 5
    for _ in range(100):
        index, valid = loss.sample_negatives(torch.tensor([2, 3]), generator)
        positions = [sorted(m - (m > d) for m in index[i, 0].tolist()) for i, d in enumerate((2, 3))]
        same += positions[0] == positions[1]
    assert same < 50
    for docs, count in (([6, 7, 8], 3), ([0, 6, 7, 8], 2)):  # the small cluster: its 2 others, each once
        loss = HCELoss(tree, levels_trained=1, n_negatives=count)
        for _ in range(30):
            index, valid = loss.sample_negatives(torch.tensor(docs), generator)
            for i, d in enumerate(docs):
                picked = index[i, 0][valid[i, 0]].tolist()
                want = min(count, 5) if d < 6 else 2
                assert len(picked) == want and len(set(picked)) == want and d not in picked
                assert set(picked) <= (set(range(6)) if d < 6 else {6, 7, 8})
    empty, mask = loss.sample_negatives(torch.tensor([], dtype=torch.long), generator)
    assert empty.shape == mask.shape == (0, 1, 2)


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
    """An "encoder" that looks (text, max length) up in a table of vectors: queries are known at
    length 5 only, passages at length 8 only, so a text encoded at the wrong length is an error."""

    device = torch.device("cpu")

    def __init__(self, table: dict[str, torch.Tensor]):
        self.table = table

    def tokenize(self, texts, length):
        return [(t, length) for t in texts]

    def __call__(self, batch):
        return torch.stack([self.table[t if length == (8 if t.startswith("text") else 5) else None]
                            for t, length in batch])


def test_objective_weighs_streams_and_gives_the_tree_terms_to_hierarchical_streams_only(small):
    """J = L_S + alpha * L_U (Eq. 7): a hierarchical stream gets Eq. 5 + Eq. 8 with its sampled
    negatives (taken from the cache), a plain stream Eq. 8 alone, with a query's other relevant
    document left out of its negatives."""
    import itertools

    import pandas as pd

    from model_code.methods.hce.objective import HCEObjective
    from model_code.training.objectives import Stream
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
    objective = HCEObjective(TableEncoder(table), loss, streams, tree.doc_ids, passages, cache, False, 5, 8,
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


def objective_case(n_negatives: int, encode: bool, relevant: dict[str, list[str]]):
    """Eight documents in leaf clusters {0..3}, {4..7}; one hierarchical stream whose rows pair the
    queries of ``relevant`` with each of their documents; the Eq. 5 + Eq. 8 value by hand."""
    import itertools

    import pandas as pd

    from model_code.methods.hce.objective import HCEObjective
    from model_code.training.objectives import Stream
    from model_code.training.pairs import with_positives

    g = torch.Generator().manual_seed(11)
    tree = CorpusTree(doc_ids=[f"d{i}" for i in range(8)], doc_path=np.array([[0]] * 4 + [[1]] * 4),
                      centroids=[np.array([[1.0, 0.2, 0.0], [0.0, 1.0, 0.5]], dtype=np.float32)],
                      parents=[np.array([0, 0])])
    passages = [f"text of d{i}" for i in range(8)]
    cache = F.normalize(torch.randn(8, 3, generator=g, dtype=torch.float64), dim=-1)
    table = {t: F.normalize(torch.randn(3, generator=g, dtype=torch.float64), dim=0) for t in passages + list(relevant)}
    pairs = with_positives(pd.DataFrame([(q, d) for q, docs in relevant.items() for d in docs], columns=["query", "doc_id"]))
    loss = HCELoss(tree, levels_trained=1, temperature=TAU, n_negatives=n_negatives).double()
    encoder, calls = TableEncoder(table), []
    objective = HCEObjective(encoder, loss, [Stream("s", itertools.repeat(pairs), 1.0)], tree.doc_ids, passages,
                             cache, encode, 5, 8, torch.Generator().manual_seed(9),
                             forward=lambda batch: calls.append(len(batch)) or encoder(batch))  # as a DDP wrapper
    objective.calls = calls
    rows = [int(d[1:]) for d in pairs["doc_id"]]
    index, valid = loss.sample_negatives(torch.tensor(rows), torch.Generator().manual_seed(9),
                                         [{int(d[1:]) for d in p} for p in pairs["positives"]])
    negatives = (torch.stack([table[passages[i]] for i in index.flatten().tolist()]).reshape(*index.shape, 3)
                 if encode and index.numel() else cache[index])
    q = [table[t].tolist() for t in pairs["query"]]
    p = [table[passages[d]].tolist() for d in rows]
    shared = [[i != j and pairs["doc_id"].iat[j] in pairs["positives"].iat[i] for j in range(len(rows))]
              for i in range(len(rows))]
    b = len(rows)
    forward = sum(neg_log_softmax(dot(q[i], p[i]) / TAU, [dot(q[i], p[j]) / TAU for j in range(b) if j != i
                                                           and not shared[i][j]]
                                  + [dot(q[i], n) / TAU for n, ok in zip(negatives[i, 0].tolist(), valid[i, 0]) if ok])
                  for i in range(b)) / b
    backward = sum(neg_log_softmax(dot(p[i], q[i]) / TAU, [dot(p[i], q[j]) / TAU for j in range(b) if j != i
                                                            and not shared[j][i]]) for i in range(b)) / b
    clusters = [0 if d < 4 else 1 for d in rows]
    return objective, eq5(q, tree.centroids[0].tolist(), clusters) + forward + backward, index, valid


@pytest.mark.parametrize(("n_negatives", "encode", "relevant"), [
    (2, False, {"qa": ["d0"], "qb": ["d5"], "qc": ["d2"], "qd": ["d7"]}),
    (2, True, {"qa": ["d0"], "qb": ["d5"], "qc": ["d2"], "qd": ["d7"]}),
    (1, True, {"qa": ["d0"]}),  # a single negative in all, encoded
    (0, True, {"qa": ["d0"], "qb": ["d5"]}),  # none to encode
])
def test_objective_draws_negatives_with_its_generator_and_takes_them_from_cache_or_encoder(n_negatives, encode, relevant):
    """Two of three leaf-cluster siblings per row: which two depends on the objective's generator."""
    objective, want, _, _ = objective_case(n_negatives, encode, relevant)
    total, _ = objective()
    assert float(total.detach()) == pytest.approx(want, rel=1e-9)
    assert sum(objective.calls) == 2 * len(relevant) + (len(relevant) * n_negatives if encode else 0)


def test_objective_masks_a_sampled_negative_relevant_to_the_same_query():
    """All three siblings are drawn; for "qa" (relevant to d0 and d1) the other one must be masked."""
    objective, want, index, valid = objective_case(3, False, {"qa": ["d0", "d1"], "qb": ["d5"]})
    assert not valid[0, 0][index[0, 0] == 1].any() and valid[2].all()
    total, _ = objective()
    assert float(total.detach()) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("hierarchical", [True, False])
def test_objective_on_one_rank_of_two(monkeypatch, hierarchical):
    """Rank 1 of 2 (simulated): it encodes rows 2-3 only and scores them against the gathered batch."""
    from model_code.training import objectives

    objective, _, _, _ = objective_case(0, False, {"qa": ["d0"], "qb": ["d5"], "qc": ["d2"], "qd": ["d7"]})
    objective.streams[0].hierarchical = hierarchical
    table, passages = objective.encoder.table, objective.passages
    q = torch.stack([table[t] for t in ("qa", "qb", "qc", "qd")])
    p = torch.stack([table[passages[d]] for d in (0, 5, 2, 7)])
    other_rank = [q[:2], p[:2]]  # what the all-gather brings from rank 0, queries first
    monkeypatch.setattr(objectives, "local_slice", lambda size: slice(size // 2, size))
    monkeypatch.setattr(objectives, "gather_with_grad", lambda local: torch.cat([other_rank.pop(0), local]))
    total, _ = objective()
    Q, P = q.tolist(), p.tolist()
    forward = [neg_log_softmax(dot(Q[i], P[i]) / TAU, [dot(Q[i], P[j]) / TAU for j in range(4) if j != i])
               for i in (2, 3)]
    backward = [neg_log_softmax(dot(P[i], Q[i]) / TAU, [dot(P[i], Q[j]) / TAU for j in range(4) if j != i])
                for i in (2, 3)]
    level_1 = eq5(Q[2:], objective.loss.centroids[0].detach().tolist(), [0, 1]) if hierarchical else 0.0
    assert float(total.detach()) == pytest.approx(level_1 + sum(forward) / 2 + sum(backward) / 2, rel=1e-9)


def test_eq8_for_rank_0_rows_and_the_papers_defaults(small):
    """Rows 0-1 of a global batch of 4 (offset 0): the false-negative mask is cut to those rows."""
    tree = small[0]
    g = torch.Generator().manual_seed(3)
    q = F.normalize(torch.randn(4, 3, generator=g, dtype=torch.float64), dim=-1)
    p = F.normalize(torch.randn(4, 3, generator=g, dtype=torch.float64), dim=-1)
    known = torch.zeros(4, 4, dtype=torch.bool)
    known[0, 2] = known[2, 0] = True
    got = bidirectional_infonce(q[:2], p[:2], TAU, all_queries=q, all_passages=p, offset=0, false_negatives=known)
    Q, P = q.tolist(), p.tolist()
    forward = [neg_log_softmax(dot(Q[i], P[i]) / TAU, [dot(Q[i], P[j]) / TAU for j in range(4) if j != i
                                                        and not known[i, j]]) for i in (0, 1)]
    backward = [neg_log_softmax(dot(P[i], Q[i]) / TAU, [dot(P[i], Q[j]) / TAU for j in range(4) if j != i
                                                         and not known[j, i]]) for i in (0, 1)]
    assert float(got) == pytest.approx(sum(forward) / 2 + sum(backward) / 2, rel=1e-10)
    loss = HCELoss(tree, levels_trained=1)  # tau = 0.01 and n_NS = 4 (HCE §5)
    assert loss.temperature == 0.01 and loss.n_negatives == 4
    with pytest.raises(ValueError, match=r"^levels_trained must be in \[0, 1\], got 2$"):
        HCELoss(tree, levels_trained=2)
    uneven = CorpusTree(doc_ids=["a", "b", "c"], doc_path=np.array([[0, 0], [0, 1], [1, -1]]),
                        centroids=[np.eye(2, dtype=np.float32)] * 2, parents=[np.array([0, 0])] * 2)
    with pytest.raises(ValueError, match="^the HCE loss needs an equal-depth tree: use hierarchy.builder=agglomerative$"):
        HCELoss(uneven, levels_trained=1)
