"""Splits (``model_code/data/splits.py``): the document split has exact shares and is stable under
reordering; a dev split is carved from train only when the dataset has none."""

import pandas as pd

from model_code.data.splits import carve_dev, split_documents


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


def test_the_dev_carve_moves_whole_queries_and_leaves_other_splits_alone():
    """A query's judgements all go one way (a query in both train and dev would be trained on and
    decided on), and test is untouched."""
    train = pd.DataFrame({"query_id": [f"q{i // 3}" for i in range(300)], "doc_id": [f"d{i}" for i in range(300)],
                          "relevance": 1})
    test = pd.DataFrame({"query_id": ["t1"], "doc_id": ["d0"], "relevance": 1})
    carved = carve_dev({"train": train, "test": test}, 0.2, seed=1)
    assert set(carved["train"]["query_id"]).isdisjoint(carved["dev"]["query_id"])
    assert carved["dev"].groupby("query_id").size().eq(3).all() and len(carved["dev"]) + len(carved["train"]) == 300
    assert carved["test"] is test


def test_a_split_with_no_judgement_is_refused_by_name_not_scored_nan():
    """Before: three train queries carved into a dev split of none (or a header-only dev.tsv) scored
    NaN, which checkpoint selection read as worse than anything (it kept the untrained step) and
    promotion compared as never better (every later version a challenger)."""
    import pytest

    from model_code.data.ingested import IngestedData

    train = pd.DataFrame({"query_id": ["q1", "q2", "q3"], "doc_id": ["d1", "d2", "d3"], "relevance": [1, 1, 1]})
    qrels = carve_dev({"train": train}, 0.1, 13)
    assert (len(qrels["train"]), len(qrels["dev"])) == (3, 0)  # no query hashes below 0.1 with this seed
    data = IngestedData(corpus=pd.DataFrame(), queries=pd.DataFrame(), qrels=qrels)
    with pytest.raises(ValueError, match=r"'dev' qrels hold no judgement \(data\.dev_fraction carved no train query"):
        data.qrels_for("dev")
    assert len(data.qrels_for("train")) == 3
