"""Training pairs and their batches (``model_code/training/pairs.py``), against properties counted
by hand: which qrels are pairs, every pair once per pass, no passage twice in a batch, an endless
stream, the seed's sequence."""

from __future__ import annotations

import collections
import itertools

import pandas as pd
import pytest

from model_code.data.ingested import IngestedData
from model_code.training.pairs import batches, pseudo_pairs, supervised_pairs, with_positives


def pairs_of(docs: list[str]) -> pd.DataFrame:
    """One pair per entry of ``docs``, each with a query of its own."""
    return with_positives(pd.DataFrame({"query": [f"q{i}" for i in range(len(docs))], "doc_id": docs}))


def test_supervised_pairs_are_the_relevant_train_qrels_with_their_querys_positives():
    corpus = pd.DataFrame({"doc_id": ["d0", "d1", "d2", "d3"], "title": "", "text": ["a", "b", "c", "d"]})
    queries = pd.DataFrame({"query_id": ["qa", "qb", "qt"], "text": ["query a", "query b", "query t"]})
    train = pd.DataFrame({"query_id": ["qa", "qa", "qa", "qb"], "doc_id": ["d0", "d1", "d2", "d3"],
                          "relevance": [1, 2, 0, 1]})  # d2 was judged for qa and found not relevant
    test = pd.DataFrame({"query_id": ["qt"], "doc_id": ["d0"], "relevance": [1]})
    pairs = supervised_pairs(IngestedData(corpus, queries, {"train": train, "test": test}))
    assert pairs["query"].tolist() == ["query a", "query a", "query b"]
    assert pairs["doc_id"].tolist() == ["d0", "d1", "d3"]
    assert pairs["positives"].tolist() == [frozenset({"d0", "d1"})] * 2 + [frozenset({"d3"})]


def test_pseudo_pairs_are_each_pseudo_query_with_its_source_document():
    generated = pd.DataFrame({"doc_id": ["d0", "d0", "d1"], "text": ["span one", "span two", "span one"]})
    pairs = pseudo_pairs(generated)
    assert pairs["query"].tolist() == ["span one", "span two", "span one"]
    assert pairs["doc_id"].tolist() == ["d0", "d0", "d1"]
    # the same span cut from two documents: both are that query's positives
    assert pairs["positives"].tolist() == [frozenset({"d0", "d1"}), frozenset({"d0"}), frozenset({"d0", "d1"})]


def test_each_pass_over_distinct_passages_is_a_new_shuffle_of_every_pair_once():
    pairs = pairs_of([f"d{i}" for i in range(12)])
    stream = batches(pairs, 4, seed=5)
    passes = [[doc for _ in range(3) for doc in next(stream)["doc_id"]] for _ in range(3)]
    for drawn in passes:
        assert sorted(drawn) == sorted(pairs["doc_id"])  # batches of 4, every pair once per pass
    assert passes[0] != passes[1] != passes[2]


def test_no_passage_twice_in_a_batch_and_the_stream_never_runs_dry():
    """d0 is the positive of three queries and the batch needs all four passages, so each batch
    takes one d0 pair and the others pile up until a batch cannot be filled from what is left:
    the stream must reshuffle then, not stop."""
    pairs = pairs_of(["d0", "d0", "d0", "d1", "d2", "d3"])
    drawn = list(itertools.islice(batches(pairs, 4, seed=0), 60))
    assert len(drawn) == 60
    for batch in drawn:
        assert sorted(batch["doc_id"]) == ["d0", "d1", "d2", "d3"]
    assert len(collections.Counter(q for batch in drawn for q in batch["query"] if q in ("q0", "q1", "q2"))) == 3


def test_the_stream_is_the_seeds():
    pairs = pairs_of([f"d{i}" for i in range(20)])

    def first(seed: int) -> list[list[str]]:
        return [b["doc_id"].tolist() for b in itertools.islice(batches(pairs, 4, seed), 10)]

    assert first(3) == first(3) and first(3) != first(4)


def test_fewer_distinct_passages_than_the_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="need at least 4 distinct positive documents, have 3"):
        next(batches(pairs_of(["d0", "d1", "d2", "d2"]), 4, seed=0))
