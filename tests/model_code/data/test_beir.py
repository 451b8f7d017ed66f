"""BEIR's convention for judged documents missing from the corpus: the qrels rows naming them are
kept, so their queries are scored (a query with no relevant document in the corpus scores 0 and
counts in the mean; a missing document still counts in the ideal DCG and in recall's
denominator), while training, which needs a passage for every pair, ignores those rows."""

import json
import math

import pandas as pd
import pytest

from model_code.data.ingested import load_ingested
from model_code.training.pairs import supervised_pairs
from tests.conftest import run_stages, tiny_params

DOCS = {"volcano-1": "volcano lava magma eruption crater", "violin-1": "violin cello orchestra sonata bow",
        "glacier-1": "glacier ice fjord moraine snow", "desert-1": "desert sand dune cactus camel",
        "forest-1": "forest tree moss fern pine"}
QUERIES = {"q-mixed": "volcano lava magma", "q-found": "violin cello", "q-gone": "glacier ice",
           "q-train-ok": "desert sand", "q-train-mixed": "forest moss", "q-train-gone": "pine fern"}
QRELS = {  # volcano-2, glacier-9, forest-8 and forest-9 are not in the corpus
    "test": [("q-mixed", "volcano-1"), ("q-mixed", "volcano-2"), ("q-found", "violin-1"), ("q-gone", "glacier-9")],
    "train": [("q-train-ok", "desert-1"), ("q-train-mixed", "forest-1"), ("q-train-mixed", "forest-8"),
              ("q-train-gone", "forest-9")],
}
METRICS = ["ndcg@10", "recall@10", "mrr@10"]


def write_corpus(directory):
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in DOCS.items()))
    (directory / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in QUERIES.items()))
    for split, pairs in QRELS.items():
        (directory / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in pairs))
    return directory


@pytest.fixture
def evaluated(tmp_path, tiny_model_dir):
    beir = write_corpus(tmp_path / "beir")
    params = tiny_params(beir, tiny_model_dir, retriever={"kind": "bm25", "bm25": {"stemmer": None, "stopwords": None}},
                         eval={"top_k": 10, "metrics": METRICS},
                         data={"source": "beir", "path": str(beir), "dev_fraction": 0.0})
    return run_stages(tmp_path / "ws", params, "ingest", "index", "evaluate")


def test_a_query_whose_relevant_documents_are_missing_is_scored_as_beir_scores_it(evaluated):
    metrics = json.loads((evaluated.eval_report / "metrics.json").read_text())
    per_query = pd.read_csv(evaluated.eval_report / "per_query.csv").set_index("query_id")
    run = [line.split() for line in (evaluated.eval_report / "run.trec").read_text().splitlines()]
    first = {q: d for q, _, d, rank, _, _ in run if rank == "1"}
    assert first == {"q-mixed": "volcano-1", "q-found": "violin-1", "q-gone": "glacier-1"}  # what the hand sums assume
    # q-mixed finds volcano-1 first; the ideal ranking has volcano-2 second: IDCG = 1 + 1/log2(3)
    want = {"q-mixed": {"ndcg@10": 1 / (1 + 1 / math.log2(3)), "recall@10": 0.5, "mrr@10": 1.0},
            "q-found": {"ndcg@10": 1.0, "recall@10": 1.0, "mrr@10": 1.0},
            "q-gone": {"ndcg@10": 0.0, "recall@10": 0.0, "mrr@10": 0.0}}  # glacier-1 is not judged
    assert metrics["queries"] == 3 and sorted(per_query.index) == sorted(want)
    for metric in METRICS:
        assert per_query[metric].to_dict() == pytest.approx({q: v[metric] for q, v in want.items()}, abs=1e-6), metric
        assert metrics[metric] == pytest.approx(sum(v[metric] for v in want.values()) / 3, abs=1e-6), metric

    # BEIR's own computation: pytrec_eval over every qrels row of the file and the run, averaged per query
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels: dict[str, dict[str, int]] = {}
    for query_id, doc_id in QRELS["test"]:
        qrels.setdefault(query_id, {})[doc_id] = 1
    ranking: dict[str, dict[str, float]] = {}
    for query_id, _, doc_id, _, score, _ in run:
        ranking.setdefault(query_id, {})[doc_id] = float(score)
    beir = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10"}).evaluate(ranking)
    assert len(beir) == 3
    for metric, measure in (("ndcg@10", "ndcg_cut_10"), ("recall@10", "recall_10")):
        assert metrics[metric] == pytest.approx(sum(s[measure] for s in beir.values()) / len(beir), abs=1e-6)


def test_ingest_keeps_and_counts_the_rows_and_training_ignores_them(evaluated):
    summary = json.loads((evaluated.ingest_report / "summary.json").read_text())
    assert summary["qrels_missing_documents"] == {"test": 2, "train": 2}
    assert summary["rejected_rows"] == 0 and summary["judged_queries"] == {"test": 3, "train": 3}
    data = load_ingested(evaluated.ingested)
    assert {(q, d) for q, d in zip(data.qrels["test"]["query_id"], data.qrels["test"]["doc_id"])} == set(QRELS["test"])

    pairs = supervised_pairs(data)  # a pair needs the passage it trains on
    assert sorted(zip(pairs["query"], pairs["doc_id"])) == [("desert sand", "desert-1"), ("forest moss", "forest-1")]
    assert pairs.set_index("doc_id").loc["forest-1", "positives"] == {"forest-1"}
    groups = pd.read_parquet(evaluated.ingested / "query_groups.parquet")  # each by its documents in the corpus
    assert sorted(groups["query_id"]) == ["q-found", "q-mixed", "q-train-mixed", "q-train-ok"]


def test_a_document_is_encoded_as_beir_encodes_it():
    """BEIR's evaluation encodes ``(title + " " + text).strip()`` (beir.retrieval.models.SentenceBERT,
    sep " "): one space between them, a title kept as written, no title leaves the text alone."""
    from model_code.data.ingested import passage_texts

    documents = pd.DataFrame({"title": ["Aspirin.", "Aspirin", "", " Heart ", "T"],
                              "text": ["It thins blood.", "It thins blood.", " Only text ", "rate", ""]})
    assert passage_texts(documents) == ["Aspirin. It thins blood.", "Aspirin It thins blood.", "Only text",
                                        "Heart  rate", "T"]


def test_the_passage_text_a_version_records_is_the_join_documents_are_encoded_with():
    """Registered versions record ``PASSAGE_TEXT`` (tag ``passage_text``) as the form their vectors
    were made from: a change to the join without a new name would go unseen by every champion."""
    from model_code.data.ingested import passage_texts
    from model_code.freshness.report import PASSAGE_TEXT, UNRECORDED_PASSAGE_TEXT

    documents = pd.DataFrame({"title": ["Aspirin", "Heart."], "text": ["It thins blood.", "rate"]})
    assert passage_texts(documents) == [PASSAGE_TEXT.format(title=t, text=x) for t, x in
                                        zip(documents["title"], documents["text"])]
    assert UNRECORDED_PASSAGE_TEXT.format(title="Aspirin", text="It thins blood.") != passage_texts(documents)[0]


def test_a_byte_order_mark_a_bare_carriage_return_and_a_huge_integer_are_read_or_named(tmp_path):
    """Before: a BOM (Windows editors write one) refused a JSONL file as malformed and turned the qrels
    header into a rejected row; a non-UTF-8 qrels file failed naming no file; an integer of 5,000
    digits (valid JSON) failed naming no line."""
    from model_code.data.beir import read_beir
    from model_code.data.tables import IngestError

    directory = write_corpus(tmp_path / "beir")
    bom = b"\xef\xbb\xbf"
    (directory / "corpus.jsonl").write_bytes(bom + (directory / "corpus.jsonl").read_bytes())
    (directory / "qrels" / "test.tsv").write_bytes(bom + b"query-id\tcorpus-id\tscore\rq-found\tviolin-1\t1\r")
    raw = read_beir(directory)
    assert raw.corpus["doc_id"].tolist() == list(DOCS) and not raw.rejects
    assert raw.qrels["test"][["query_id", "doc_id", "relevance", "line"]].values.tolist() == [
        ["q-found", "violin-1", "1", 2]]

    (directory / "qrels" / "test.tsv").write_bytes(b"query-id\tcorpus-id\tscore\nq-found\tviol\xe9n-1\t1\n")
    with pytest.raises(IngestError, match=r"test\.tsv: not UTF-8 text: byte 37 \(line 2\)"):
        read_beir(directory)
    (directory / "qrels" / "test.tsv").unlink()
    with (directory / "queries.jsonl").open("a") as queries:
        queries.write('{"_id": "q-big", "text": "x", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(IngestError, match=rf"queries\.jsonl:{len(QUERIES) + 1}: unreadable JSON"):
        read_beir(directory)
