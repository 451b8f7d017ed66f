"""Unit tests of the pure building blocks: ICT spans, tree, loss, FAISS index, metrics, splits."""

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from model_code.config import IndexParams
from model_code.data.splits import carve_dev, split_documents
from model_code.eval.metrics import evaluate
from model_code.hierarchy.tree import CorpusTree, auto_branching, build_tree
from model_code.losses.contrastive import bidirectional_infonce
from model_code.stages.querygen import ict_spans
from model_code.stores.faiss_store import FaissStore
from model_code.training.pairs import batches, false_negatives, with_positives


def unit_rows(n: int, d: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_ict_spans_are_contiguous_seeded_and_sized():
    text = " ".join(f"w{i}" for i in range(100))
    spans = ict_spans(text, 10, 3, np.random.default_rng(1))
    assert spans == ict_spans(text, 10, 3, np.random.default_rng(1))
    for span in spans:
        words = span.split()
        start = int(words[0][1:])
        assert words == [f"w{i}" for i in range(start, start + 10)]
    assert ict_spans("short text", 10, 2, np.random.default_rng(1)) == ["short text", "short text"]


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


def test_bidirectional_infonce_matches_definition():
    torch.manual_seed(0)
    q, p = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    scores = q @ p.T / 0.1
    expected = -torch.log_softmax(scores, dim=1).diag().mean() - torch.log_softmax(scores, dim=0).diag().mean()
    assert torch.allclose(bidirectional_infonce(q, p, 0.1), expected)
    assert bidirectional_infonce(q, q, 0.01) < 0.05  # aligned pairs cost (almost) nothing


def test_a_querys_other_relevant_passages_are_not_its_negatives():
    pairs = with_positives(pd.DataFrame({"query": ["q1", "q2", "q1", "q3"], "doc_id": ["a", "b", "c", "d"]}))
    assert pairs["positives"].tolist() == [frozenset("ac"), frozenset("b"), frozenset("ac"), frozenset("d")]
    batch = next(batches(pairs, 4, seed=0))
    mask = false_negatives(batch)
    rows = {doc: i for i, doc in enumerate(batch["doc_id"])}
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[rows["a"], rows["c"]] = expected[rows["c"], rows["a"]] = True
    assert torch.equal(mask, expected)

    torch.manual_seed(0)
    q, p = F.normalize(torch.randn(4, 8), dim=-1), F.normalize(torch.randn(4, 8), dim=-1)
    scores = (q @ p.T / 0.1).masked_fill(expected, float("-inf"))  # the masked pair drops out of both softmaxes
    reference = -torch.log_softmax(scores, 1).diag().mean() - torch.log_softmax(scores, 0).diag().mean()
    assert torch.allclose(bidirectional_infonce(q, p, 0.1, false_negatives=mask), reference)
    assert bidirectional_infonce(q, p, 0.1, false_negatives=mask) < bidirectional_infonce(q, p, 0.1)


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat", "HNSW16"])
def test_index_factories_find_each_document_itself(tmp_path, factory):
    vectors = unit_rows(300, 16)
    ids = [f"doc{i}" for i in range(300)]
    index = FaissStore.build(vectors, ids, IndexParams(factory=factory, nprobe=4))
    index.save(tmp_path / "idx")
    loaded = FaissStore.load_files(tmp_path / "idx")
    scores, hits = loaded.search(vectors[:20], k=3)
    assert [h[0] for h in hits] == ids[:20]
    assert np.allclose(scores[:, 0], 1.0, atol=1e-4)


def test_invalid_factory_is_a_clear_error():
    with pytest.raises(ValueError, match="not a valid faiss factory"):
        FaissStore.build(unit_rows(10, 4), [str(i) for i in range(10)], IndexParams(factory="NoSuchIndex"))


def test_metrics_perfect_partial_and_missing_queries():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    run = {"q1": {"a": 0.9, "x": 0.1}, "q2": {"x": 0.9, "b": 0.5}}  # q3 retrieved nothing
    means, per_query = evaluate(qrels, run, ["mrr@10", "recall@1", "recall@10"])
    assert means["mrr@10"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert means["recall@1"] == pytest.approx(1 / 3)
    assert means["recall@10"] == pytest.approx(2 / 3)
    assert list(per_query["query_id"]) == ["q1", "q2", "q3"]


def test_document_split_has_exact_shares_and_is_stable():
    ids = pd.Series([f"d{i}" for i in range(1000)])
    split = split_documents(ids, {"old": 0.9, "new": 0.09, "tune": 0.01}, seed=3)
    assert split["group"].value_counts().to_dict() == {"old": 900, "new": 90, "tune": 10}
    shuffled = split_documents(ids.sample(frac=1, random_state=0).reset_index(drop=True), {"old": 0.9, "new": 0.09, "tune": 0.01}, seed=3)
    assert dict(zip(split["doc_id"], split["group"])) == dict(zip(shuffled["doc_id"], shuffled["group"]))


def test_dev_split_only_when_missing():
    train = pd.DataFrame({"query_id": [f"q{i}" for i in range(100)], "doc_id": "d", "relevance": 1})
    carved = carve_dev({"train": train}, 0.2, seed=1)
    assert 10 < len(carved["dev"]) < 30 and len(carved["dev"]) + len(carved["train"]) == 100
    given = {"train": train, "dev": train.head(3)}
    assert carve_dev(given, 0.2, seed=1) is given


def test_incremental_add_and_remove_equal_a_rebuild():
    from faiss.contrib.evaluation import check_ref_knn_with_draws

    vectors = unit_rows(400, 16)
    ids = [f"doc{i}" for i in range(400)]
    incremental = FaissStore.build(vectors[:300], ids[:300])
    incremental.add(vectors[300:], ids[300:])
    incremental.remove(["doc5", "doc350"])
    keep = [i for i in range(400) if i not in (5, 350)]
    rebuilt = FaissStore.build(vectors[keep], [ids[i] for i in keep])
    queries = unit_rows(25, 16, seed=9)
    d_inc, hits_inc = incremental.search(queries, 10)
    d_ref, hits_ref = rebuilt.search(queries, 10)
    position = {d: i for i, d in enumerate(ids)}
    check_ref_knn_with_draws(
        d_ref, np.array([[position[h] for h in row] for row in hits_ref]),
        d_inc, np.array([[position[h] for h in row] for row in hits_inc]),
    )
    assert "doc5" not in {h for row in hits_inc for h in row}
    with pytest.raises(ValueError, match="already indexed"):
        incremental.add(vectors[:1], ["doc7"])


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
