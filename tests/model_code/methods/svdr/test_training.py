"""SVDR's in-training negative retrieval (``retriever.svdr.retrieved_negatives``; docs/svdr.md)
against independent computations: the pools against a brute-force top-k of the query's sparse
vector E(q)_k times hand-made bags of tokens, relevant documents never drawn, the training
objective's loss with the retrieved negatives against the loss in NumPy (one process, and rank 1
of 2), and the switch off leaving the objective the plain in-batch loss; and the objective itself:
the loss of the encoded batch and its mined hard negatives, and on rank 1 of 2 its rows of texts cut at
their lengths, each term against NumPy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import yaml

from model_code.config import load_params
from model_code.data.ingested import IngestedData, passage_texts
from model_code.layout import Layout
from model_code.methods.svdr import training as svdr_training
from model_code.methods.svdr.model import SparseEncoder
from model_code.methods.svdr.retriever import SVDRSettings
from model_code.methods.svdr.training import SVDRObjective, retrieved_negatives
from model_code.stages import train
from model_code.stores.csr_store import CsrStore
from model_code.training import objectives
from model_code.training.negatives import HardNegatives, RetrievedNegatives
from model_code.training.objectives import Stream
from tests.conftest import tiny_params
from tests.helpers import svdr as hand
from tests.helpers.svdr import binary, ell, sparsified

# Short documents that share single words with the queries: beta scores are sums of the few shared
# tokens' weights, so equal token sets tie (d1 and d10 share only "comet" with the first query) and
# the brute force breaks ties as the index documents it, lower row first.
CORPUS = pd.DataFrame({"doc_id": [f"d{i}" for i in range(12)], "title": "", "text": [
    "comet orbit telescope", "comet tail dust", "telescope lens mirror", "orbit moon planet",
    "planet rings dust telescope", "butter flour oven", "oven bread dough", "butter recipe sugar",
    "guitar chord tempo", "tempo rhythm drum", "drum comet festival oven", "guitar recipe song"]})
TEXTS = dict(zip(CORPUS["doc_id"], passage_texts(CORPUS)))
QUERIES = ["comet telescope orbit", "butter oven recipe", "guitar tempo drum"]
# d2 is also relevant to the first query and d8 to the third: both rank above their non-relevant hits
BATCH = pd.DataFrame({"query": QUERIES, "doc_id": ["d0", "d5", "d9"],
                      "positives": [frozenset({"d0", "d2"}), frozenset({"d5"}), frozenset({"d9", "d8"})]})
TOPK, QUERY_LENGTH, PASSAGE_LENGTH = 50, 8, 12


def hand_bags(tokenizer) -> np.ndarray:
    return binary(tokenizer, list(TEXTS.values()), PASSAGE_LENGTH)


def brute_force_pools(q_k: np.ndarray, bags: np.ndarray, positives, depth: int) -> list[list[str]]:
    """Per query: its ``depth`` best documents by q_k · T(d) that are not relevant to it, ties by row."""
    scores = q_k @ bags.T
    return [[f"d{i}" for i in sorted(range(len(bags)), key=lambda i: (-row[i], i)) if f"d{i}" not in relevant][:depth]
            for row, relevant in zip(scores, positives)]


def hand_queries(encoder, queries: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The queries' pooled vectors and bags of tokens, encoded apart from the objective."""
    with torch.no_grad():
        q = encoder(encoder.tokenize(queries, QUERY_LENGTH), "query").double().numpy()
    return q, binary(encoder.tokenizer, queries, QUERY_LENGTH)


def hand_index(tokenizer) -> CsrStore:
    return CsrStore.build(sp.csr_matrix(hand_bags(tokenizer).astype(np.float32)), list(TEXTS))


def spy_on_draws(retrieved: RetrievedNegatives) -> list:
    """Record what ``retrieved.draw`` returns (the real draw)."""
    drawn, real = [], retrieved.draw
    retrieved.draw = lambda batch, queries: drawn.append(real(batch, queries)) or drawn[-1]
    return drawn


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    model = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        model.passage.norm.bias.fill_(0.25)  # the two sides differ: negatives must go through the passage side
    return model


def test_pools_are_the_brute_force_top_non_relevant_beta_hits(encoder):
    q, bin_q = hand_queries(encoder, QUERIES)
    q_k, bags = sparsified(q, bin_q, TOPK), hand_bags(encoder.tokenizer)
    retrieved = RetrievedNegatives(hand_index(encoder.tokenizer), count=1, depth=3, seed=0)
    pools = retrieved.pools(BATCH, sp.csr_matrix(q_k.astype(np.float32)))
    expected = brute_force_pools(q_k, bags, BATCH["positives"], 3)
    assert pools == expected
    assert expected[0] == ["d3", "d4", "d1"]  # d2 (relevant) ranks second and is skipped; d1 ties d10 and wins by row
    assert all(not set(pool) & relevant for pool, relevant in zip(pools, BATCH["positives"]))
    # the test tells the query vectors apart: the whole vector and the pure top-k find other pools
    assert brute_force_pools(q, bags, BATCH["positives"], 3) != expected
    assert brute_force_pools(sparsified(q, 0 * bin_q, TOPK), bags, BATCH["positives"], 3) != expected


def test_draws_are_distinct_pool_members_and_every_member_is_drawn_in_time():
    """count < depth: each draw is ``count`` distinct documents of the row's pool (never a relevant
    one), and over many steps every pool member comes up."""
    bags = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 1, 1], [0, 0, 1], [1, 1, 1]], dtype=np.float32)
    index = CsrStore.build(sp.csr_matrix(bags), [f"d{i}" for i in range(6)])
    batch = pd.DataFrame({"query": ["a", "b"], "doc_id": ["d5", "d4"],
                          "positives": [frozenset({"d5", "d1"}), frozenset({"d4"})]})
    queries = sp.csr_matrix(np.array([[3.0, 2.0, 0.5], [0.0, 0.25, 4.0]], dtype=np.float32))
    # by hand: a scores d5 5.5, d1 5, d0 3, d3 2.5, d2 2, d4 0.5; b scores d4 4, d3 4.25, d5 4.25, ...
    retrieved = RetrievedNegatives(index, count=2, depth=3, seed=1)
    assert retrieved.pools(batch, queries) == [["d0", "d3", "d2"], ["d3", "d5", "d1"]]
    seen = [set(), set()]
    for _ in range(30):
        ids, excluded = retrieved.draw(batch, queries)
        assert len(ids) == 4 and len(set(ids[:2])) == 2 and len(set(ids[2:])) == 2
        seen[0] |= set(ids[:2])
        seen[1] |= set(ids[2:])
        # a candidate is excluded for a row it is relevant to: d5, b's draw, is a's positive
        assert excluded.tolist() == [[d in relevant for d in ids] for relevant in batch["positives"]]
    assert seen == [{"d0", "d3", "d2"}, {"d3", "d5", "d1"}]


def test_a_pool_smaller_than_the_count_pads_with_the_rows_positive_excluded():
    index = CsrStore.build(sp.csr_matrix(np.eye(3, dtype=np.float32)), ["d0", "d1", "d2"])
    batch = pd.DataFrame({"query": ["a"], "doc_id": ["d0"], "positives": [frozenset({"d0", "d1"})]})
    ids, excluded = RetrievedNegatives(index, count=2, depth=2, seed=0).draw(batch, sp.csr_matrix([[1.0, 1.0, 1.0]]))
    assert ids == ["d2", "d0"] and excluded.tolist() == [[False, True]]


def expected_terms(encoder, queries, passages, excluded, rows=slice(None)) -> dict[str, float]:
    q, bin_q = hand_queries(encoder, queries)
    with torch.no_grad():
        p = encoder(encoder.tokenize(passages, PASSAGE_LENGTH), "passage").double().numpy()
    bin_p = binary(encoder.tokenizer, passages, PASSAGE_LENGTH)
    return {"q_k.p": ell(sparsified(q, bin_q, TOPK), p, rows, excluded),
            "q.p_k": ell(q, sparsified(p, bin_p, TOPK), rows, excluded),
            "bin_q.p": ell(bin_q, p, rows, excluded), "q.bin_p": ell(q, bin_p, rows, excluded)}


def relevance_mask(batch: pd.DataFrame, candidates: list[str]) -> np.ndarray:
    """(B, len(candidates)): set where candidate c is relevant to row i's query but is not its target."""
    mask = np.array([[d in relevant for d in candidates] for relevant in batch["positives"]])
    mask[np.arange(len(batch)), np.arange(len(batch))] = False  # the first B candidates are the rows' targets
    return mask


@pytest.mark.parametrize("mined", [False, True])
def test_the_objective_scores_the_retrieved_negatives_after_any_mined_ones(encoder, mined):
    """count = depth: each row's draw is its whole brute-force pool, so the loss is known without
    the draw's order. With mined negatives, the retrieved block follows theirs."""
    mined_pools = pd.DataFrame({"query": QUERIES, "doc_id": ["d6", "d3", "d1"]}) if mined else None
    retrieved = RetrievedNegatives(hand_index(encoder.tokenizer), count=3, depth=3, seed=0)
    drawn = spy_on_draws(retrieved)
    objective = SVDRObjective(encoder, [Stream("s", iter([BATCH]), 1.0)], TEXTS.__getitem__, QUERY_LENGTH,
                              PASSAGE_LENGTH, topk=TOPK, variant="svdr",
                              hard_negatives=HardNegatives(mined_pools, 1, seed=0) if mined else None,
                              retrieved=retrieved)
    loss, parts = objective()
    q, bin_q = hand_queries(encoder, QUERIES)
    pools = brute_force_pools(sparsified(q, bin_q, TOPK), hand_bags(encoder.tokenizer), BATCH["positives"], 3)
    ids, excluded = drawn[0]
    assert [set(ids[3 * i : 3 * i + 3]) for i in range(3)] == [set(pool) for pool in pools]
    assert not any(set(ids[3 * i : 3 * i + 3]) & BATCH["positives"][i] for i in range(3))
    assert excluded.tolist() == [[d in relevant for d in ids] for relevant in BATCH["positives"]]
    candidates = [*BATCH["doc_id"], *(mined_pools["doc_id"] if mined else []), *(d for pool in pools for d in pool)]
    assert "d0" in pools[2]  # the third query's negative d0 is the first query's positive: excluded for it
    expected = expected_terms(encoder, QUERIES, [TEXTS[d] for d in candidates], relevance_mask(BATCH, candidates))
    assert {k: parts[f"s.{k}"] for k in expected} == pytest.approx(expected, rel=1e-4)
    assert loss.item() == pytest.approx(sum(expected.values()) / 4, rel=1e-4)
    loss.backward()
    assert encoder.passage.norm.bias.grad is not None  # the negatives train the passage side
    encoder.zero_grad()


def test_on_rank_1_of_2_the_objective_retrieves_for_the_global_batch_and_encodes_its_rows_draws(encoder, monkeypatch):
    """Rank 1 of 2 (rows 2-3): the pools come from every row's query vector (rank 0's gathered
    rows included), rank 1 encodes only rows 2-3's draws, and the gathered block scores for its rows."""
    queries = [*QUERIES, "moon planet rings"]
    fourth = pd.DataFrame({"query": [queries[3]], "doc_id": ["d3"], "positives": [frozenset({"d3"})]})
    batch = pd.concat([BATCH, fourth], ignore_index=True)
    with torch.no_grad():
        tokens = [encoder.tokenize(queries[:2], QUERY_LENGTH),
                  encoder.tokenize([TEXTS["d0"], TEXTS["d5"]], PASSAGE_LENGTH)]
        other_rank = [torch.cat([encoder(tokens[0], "query"), encoder.lexical(tokens[0])], dim=1),
                      torch.cat([encoder(tokens[1], "passage"), encoder.lexical(tokens[1])], dim=1)]
    monkeypatch.setattr(objectives, "local_slice", lambda size: slice(size // 2, size))
    monkeypatch.setattr(objectives, "gather_with_grad", lambda local: torch.cat([other_rank.pop(0), local]))
    retrieved = RetrievedNegatives(hand_index(encoder.tokenizer), count=3, depth=3, seed=0)
    drawn, encoded_here = spy_on_draws(retrieved), []

    def gather_negatives(local):  # rank 0's rows' draws, encoded apart, before this rank's own
        encoded_here.append(len(local))
        with torch.no_grad():
            ids = drawn[0][0][:6]
            rank0 = encoder.tokenize([TEXTS[d] for d in ids], PASSAGE_LENGTH)
            return torch.cat([torch.cat([encoder(rank0, "passage"), encoder.lexical(rank0)], dim=1), local])

    monkeypatch.setattr(svdr_training, "gather_with_grad", gather_negatives)
    objective = SVDRObjective(encoder, [Stream("s", iter([batch]), 1.0)], TEXTS.__getitem__, QUERY_LENGTH,
                              PASSAGE_LENGTH, topk=TOPK, variant="svdr", retrieved=retrieved)
    _, parts = objective()
    q, bin_q = hand_queries(encoder, queries)
    pools = brute_force_pools(sparsified(q, bin_q, TOPK), hand_bags(encoder.tokenizer), batch["positives"], 3)
    ids = drawn[0][0]
    assert [set(ids[3 * i : 3 * i + 3]) for i in range(4)] == [set(pool) for pool in pools]
    assert encoded_here == [6]  # rows 2 and 3, three each
    candidates = [*batch["doc_id"], *ids]
    expected = expected_terms(encoder, queries, [TEXTS[d] for d in candidates], relevance_mask(batch, candidates),
                              rows=slice(2, 4))
    assert {k: parts[f"s.{k}"] for k in expected} == pytest.approx(expected, rel=1e-4)


def test_switched_off_the_objective_is_the_in_batch_loss_and_retrieves_nothing(encoder, monkeypatch):
    assert SVDRSettings().retrieved_negatives == 0  # off by default, as in the reference's configs
    assert retrieved_negatives(SVDRSettings(), encoder, TEXTS, PASSAGE_LENGTH, seed=0) is None
    monkeypatch.setattr(CsrStore, "search", lambda *args: pytest.fail("searched with the switch off"))
    objective = SVDRObjective(encoder, [Stream("s", iter([BATCH]), 1.0)], TEXTS.__getitem__, QUERY_LENGTH,
                              PASSAGE_LENGTH, topk=TOPK, variant="svdr")
    enc = objective.encode(BATCH)
    assert enc.hard is None and enc.hard_excluded is None
    _, parts = objective()
    positives = list(BATCH["doc_id"])
    expected = expected_terms(encoder, QUERIES, [TEXTS[d] for d in positives], relevance_mask(BATCH, positives))
    assert {k: parts[f"s.{k}"] for k in expected} == pytest.approx(expected, rel=1e-4)


def test_the_train_stages_index_is_the_corpus_bags_at_the_training_passage_length(encoder):
    settings = SVDRSettings(retrieved_negatives=2, retrieval_depth=7)
    retrieved = retrieved_negatives(settings, encoder, TEXTS, PASSAGE_LENGTH, seed=0)
    assert (retrieved.count, retrieved.depth, retrieved.index.doc_ids) == (2, 7, list(TEXTS))
    np.testing.assert_array_equal(retrieved.index.matrix.toarray(), hand_bags(encoder.tokenizer))


def test_more_draws_than_the_pool_holds_are_refused():
    with pytest.raises(ValueError, match="retrieved_negatives .5. are drawn from the top retrieval_depth .4."):
        SVDRSettings(retrieved_negatives=5, retrieval_depth=4)
    assert SVDRSettings(retrieved_negatives=4, retrieval_depth=4).retrieved_negatives == 4


def test_the_train_stage_retrieves_negatives_every_step(tmp_path, tiny_model_dir, encoder, monkeypatch):
    """The train stage on this file's corpus (the ingest stage's output stood in): each of its 2
    steps retrieves 2 negatives per row of its batch of 3, none relevant to its row's query, from
    the corpus's bags at the training passage length; the loss terms are logged as usual."""
    calls, real = [], RetrievedNegatives.draw

    def draw(self, batch, queries):
        calls.append((self, batch, *real(self, batch, queries)))
        return calls[-1][2:]

    monkeypatch.setattr(RetrievedNegatives, "draw", draw)
    queries = pd.DataFrame({"query_id": ["q0", "q1", "q2", "q3"], "text": [*QUERIES, "moon planet rings"]})
    qrels = pd.DataFrame({"query_id": ["q0", "q0", "q1", "q2", "q2", "q3"],
                          "doc_id": ["d0", "d2", "d5", "d9", "d8", "d3"], "relevance": 1})
    monkeypatch.setattr(train, "load_ingested", lambda directory: IngestedData(CORPUS, queries, {"train": qrels}))
    params = tiny_params(tmp_path / "unused", tiny_model_dir,
                         train={"data": "supervised", "batch_size": 3, "max_steps": 2,
                                "max_passage_length": PASSAGE_LENGTH},
                         retriever={"kind": "svdr", "svdr": {"retrieved_negatives": 2, "retrieval_depth": 4}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    layout = Layout(tmp_path)
    train.run(load_params(tmp_path / "params.yaml"), layout)
    text = dict(zip(queries["query_id"], queries["text"]))
    relevant = {text[q]: docs for q, docs in qrels.groupby("query_id")["doc_id"].agg(frozenset).items()}
    assert len(calls) == 2
    bags = hand_bags(encoder.tokenizer)
    for retrieved, batch, ids, excluded in calls:
        np.testing.assert_array_equal(retrieved.index.matrix.toarray(), bags)
        assert len(ids) == 6
        assert not any(set(ids[2 * i : 2 * i + 2]) & relevant[q] for i, q in enumerate(batch["query"]))
        assert excluded.tolist() == [[d in relevant[q] for d in ids] for q in batch["query"]]
    steps = pd.read_csv(layout.train_report / "steps.csv")
    assert len(steps) == 2 and {"supervised.q_k.p", "supervised.q.bin_p"} <= set(steps.columns)


def test_the_training_objective_is_the_loss_of_the_encoded_batch_and_its_hard_negatives(tiny_model_dir):
    encoder = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        encoder.passage.norm.bias.fill_(0.25)  # the two sides differ
    texts = dict(zip(hand.CORPUS["doc_id"], passage_texts(hand.CORPUS)))
    batch = pd.DataFrame({"query": hand.QUERIES, "doc_id": ["d0", "d1", "d4"],
                          "positives": [{"d0", "d1"}, {"d1"}, {"d4", "d3"}]})  # d1 is also relevant to query 0
    mined = pd.DataFrame({"query": hand.QUERIES, "doc_id": ["d3", "d2", "d5"]})  # one per query: the draw is fixed
    objective = SVDRObjective(encoder, [Stream("s", iter([batch]), 1.0)], texts.__getitem__, 8, 12, topk=50,
                              variant="svdr", hard_negatives=HardNegatives(mined, 1, seed=0))
    loss, parts = objective()
    tokenizer = encoder.tokenizer
    passages = [texts[d] for d in ["d0", "d1", "d4", "d3", "d2", "d5"]]  # the positives, then the negatives
    with torch.no_grad():
        q = encoder(encoder.tokenize(hand.QUERIES, 8), "query").double().numpy()
        p = encoder(encoder.tokenize(passages, 12), "passage").double().numpy()
    bin_q, bin_p = binary(tokenizer, hand.QUERIES, 8), binary(tokenizer, passages, 12)
    # d1 is no negative of query 0; d3, query 0's negative, is relevant to query 2
    excluded = np.array([[False, True, False, False, False, False],
                         [False, False, False, False, False, False],
                         [False, False, False, True, False, False]])
    expected = {"q_k.p": ell(sparsified(q, bin_q, 50), p, excluded=excluded),
                "q.p_k": ell(q, sparsified(p, bin_p, 50), excluded=excluded),
                "bin_q.p": ell(bin_q, p, excluded=excluded), "q.bin_p": ell(q, bin_p, excluded=excluded)}
    assert {k: parts[f"s.{k}"] for k in expected} == pytest.approx(expected, rel=1e-4)
    assert loss.item() == pytest.approx(sum(expected.values()) / 4, rel=1e-4)
    loss.backward()  # both sides and their LayerNorms train
    assert encoder.query.norm.weight.grad is not None and encoder.passage.norm.weight.grad is not None


def test_the_objective_on_rank_1_of_2_scores_its_rows_of_texts_cut_at_their_lengths(tiny_model_dir, monkeypatch):
    """Rank 1 of 2 encodes rows 2-3 (queries cut at 5 tokens, passages at 6) and scores them
    against the gathered batch: ℓ over its own rows only, each term against NumPy."""
    encoder = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        encoder.passage.norm.bias.fill_(0.25)  # the two sides differ
    texts = dict(zip(hand.CORPUS["doc_id"], passage_texts(hand.CORPUS)))
    queries = ["comet telescope planets orbit stars galaxies", "butter recipe flour oven simmer spice",
               "guitar chord tempo melody rhythm lyrics", "football league referee goal coach stadium"]
    doc_ids = ["d0", "d1", "d4", "d3"]
    passages = [texts[d] for d in doc_ids]
    batch = pd.DataFrame({"query": queries, "doc_id": doc_ids, "positives": [{d} for d in doc_ids]})

    def encoded(strings, length, side):
        tokens = encoder.tokenize(strings, length)
        return torch.cat([encoder(tokens, side), encoder.lexical(tokens)], dim=1)

    with torch.no_grad():
        other_rank = [encoded(queries[:2], 5, "query"), encoded(passages[:2], 6, "passage")]  # rank 0's rows
    monkeypatch.setattr(objectives, "local_slice", lambda size: slice(size // 2, size))
    monkeypatch.setattr(objectives, "gather_with_grad", lambda local: torch.cat([other_rank.pop(0), local]))
    objective = SVDRObjective(encoder, [Stream("s", iter([batch]), 1.0)], texts.__getitem__, 5, 6, topk=50,
                              variant="svdr")
    loss, parts = objective()
    tokenizer = encoder.tokenizer
    assert all(len(tokenizer(t)["input_ids"]) > 6 for t in queries + passages)  # every text is cut
    with torch.no_grad():
        q = encoder(encoder.tokenize(queries, 5), "query").double().numpy()
        p = encoder(encoder.tokenize(passages, 6), "passage").double().numpy()
    bin_q, bin_p = binary(tokenizer, queries, 5), binary(tokenizer, passages, 6)
    rows = slice(2, 4)
    expected = {"q_k.p": ell(sparsified(q, bin_q, 50), p, rows), "q.p_k": ell(q, sparsified(p, bin_p, 50), rows),
                "bin_q.p": ell(bin_q, p, rows), "q.bin_p": ell(q, bin_p, rows)}
    assert {k: parts[f"s.{k}"] for k in expected} == pytest.approx(expected, rel=1e-4)
    assert loss.item() == pytest.approx(sum(expected.values()) / 4, rel=1e-4)
