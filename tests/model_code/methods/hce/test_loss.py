"""HCE's loss (``model_code/methods/hce/loss.py``, with the in-batch term of
``model_code/losses/contrastive.py``) against hand computations written from the paper
(arXiv 2502.18877), not from the code:

Eq. 5 (levels t <= M): -log softmax over the positive node and its siblings of <q, c>/tau.
Eq. 8 (levels t > M): query->document over the in-batch documents and the sampled negatives,
plus document->query over the in-batch queries only; no 1/2.
Eq. 6: the levels' losses are summed.

And the sibling softmax against centroids, the subtree negatives (sampled from the leaf cluster, or
the whole corpus at the root, never another relevant document), trainable centroids, devices.
"""


import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model_code.hierarchy.tree import CorpusTree, build_tree
from model_code.losses.contrastive import bidirectional_infonce
from model_code.methods.hce.loss import HCELoss
from tests.helpers.hce import TAU, cluster_tree, dot, eq5, eq8, neg_log_softmax


@pytest.fixture(scope="module")
def tree():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return build_tree([f"d{i}" for i in range(120)], x, branching=4, niter=5, seed=0)


def test_level_loss_is_a_softmax_over_siblings(tree):
    loss = HCELoss(tree, levels_trained=2, temperature=0.1)
    torch.manual_seed(0)
    q = F.normalize(torch.randn(3, 8), dim=-1)
    docs = torch.tensor([0, 50, 119])
    level_losses = loss.level_losses(q, docs)
    for level in (1, 2):
        expected = []
        for i, d in enumerate(docs.tolist()):
            path = tree.doc_path[d]
            parent = 0 if level == 1 else path[level - 2]
            siblings = [n for n in range(len(tree.parents[level - 1])) if tree.parents[level - 1][n] == parent]
            vectors = F.normalize(torch.as_tensor(tree.centroids[level - 1][siblings]), dim=-1)
            logits = vectors @ q[i] / 0.1
            expected.append(-torch.log_softmax(logits, 0)[siblings.index(path[level - 1])])
        assert torch.allclose(level_losses[level - 1], torch.stack(expected).mean(), atol=1e-5)


def test_sampled_negatives_never_count_another_relevant_document(tree):
    loss = HCELoss(tree, levels_trained=1, n_negatives=8)
    docs = torch.arange(120)
    # every document's query is also relevant to the whole of its leaf cluster but one neighbour
    leaf = tree.doc_path[:, -1]
    positives = [set(np.flatnonzero(leaf == leaf[d]).tolist()) - {(d + 1) % 120} for d in range(120)]
    index, mask = loss.sample_negatives(docs, torch.Generator().manual_seed(0), positives)
    free, _ = loss.sample_negatives(docs, torch.Generator().manual_seed(0))
    assert torch.equal(index, free)  # the same draw, only masked
    for d in range(120):
        assert not set(index[d][mask[d]].tolist()) & positives[d]
    assert mask.any() and not mask.all()


def test_sampled_negatives_share_the_prefix_and_exclude_the_positive(tree):
    loss = HCELoss(tree, levels_trained=1, n_negatives=4)
    docs = torch.arange(120)
    index, mask = loss.sample_negatives(docs, torch.Generator().manual_seed(0))
    assert index.shape == (120, len(loss.contrastive_levels), 4)
    for j, level in enumerate(loss.contrastive_levels):  # negatives come from the node at `level`
        prefix = tree.doc_path[:, level - 1] if level > 0 else np.zeros(120, dtype=int)
        for d in range(120):
            picked = index[d, j][mask[d, j]].numpy()
            assert d not in picked
            assert (prefix[picked] == prefix[d]).all()


def test_centroids_are_trainable_and_receive_gradients(tree):
    loss = HCELoss(tree, levels_trained=2)
    q = F.normalize(torch.randn(4, 8), dim=-1)
    total = sum(loss.level_losses(q, torch.tensor([1, 2, 3, 4])))
    total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.centroids)


def test_level_losses_run_on_the_embeddings_device(tree):
    """On CUDA the centroids and queries live on the GPU while the tree lookups stay on the CPU; the
    meta device stands in for the GPU here (it rejects CPU operands such as a CPU mask the same way)."""
    loss = HCELoss(tree, levels_trained=2).to("meta")
    levels = loss.level_losses(torch.empty(4, 8, device="meta"), torch.tensor([1, 2, 3, 4]))
    assert len(levels) == 2 and all(level.device.type == "meta" for level in levels)


def test_equal_depth_tree_is_required():
    uneven = CorpusTree(
        doc_ids=["a", "b", "c"],
        doc_path=np.array([[0, 0], [0, 1], [1, -1]]),
        centroids=[np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32)],
        parents=[np.array([0, 0]), np.array([0, 0])],
    )
    with pytest.raises(ValueError, match="equal-depth"):
        HCELoss(uneven, levels_trained=1)


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
