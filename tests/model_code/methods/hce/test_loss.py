"""HCE loss: sibling softmax against centroids, subtree negatives (hand computations of Eq. 5, 6, 8: test_method_hce.py)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model_code.hierarchy.tree import CorpusTree, build_tree
from model_code.methods.hce.loss import HCELoss


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
