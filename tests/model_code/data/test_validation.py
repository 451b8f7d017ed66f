"""``data/validation.py``: a judgement's relevance that no int64 holds, or a query id holding
whitespace, is a rejected row naming its file and line, never an error that stops the ingest (or a
traceback)."""

import json

from model_code.config import DataParams
from model_code.data.beir import read_beir
from model_code.data.validation import validate_dataset


def test_a_relevance_no_int64_holds_is_a_rejected_row(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "", "text": "lava flow"}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "lava"}) + "\n")
    scores = ["1", "inf", "1e400", "1e30", "99999999999999999999", "9223372036854775807", "2.5"]
    (tmp_path / "qrels" / "test.tsv").write_text("".join(f"q1\td1\t{score}\n" for score in scores))
    data = validate_dataset(read_beir(tmp_path), DataParams(source="beir", path=str(tmp_path)))
    assert data.qrels["test"]["relevance"].tolist() == [1, 2**63 - 1]  # int64's largest is kept
    assert [(r["line"], r["field"]) for r in data.rejects] == [(2, "relevance"), (3, "relevance"), (4, "relevance"),
                                                               (5, "relevance"), (7, "relevance")]


def test_a_query_id_holding_whitespace_is_a_rejected_row(tmp_path):
    """A run.trec line is split on whitespace: "q 1" would be written as a query "q" ranking "1"."""
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "", "text": "lava flow"}) + "\n")
    queries = [{"_id": "q1", "text": "lava"}, {"_id": "q 2", "text": "flow"}, {"_id": "q\t3", "text": "ash"}]
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (tmp_path / "qrels" / "test.tsv").write_text("q1\td1\t1\n")
    data = validate_dataset(read_beir(tmp_path), DataParams(source="beir", path=str(tmp_path)))
    assert data.queries["query_id"].tolist() == ["q1"]
    assert [(r["table"], r["line"], r["field"]) for r in data.rejects] == [("queries", 2, "query_id"),
                                                                           ("queries", 3, "query_id")]
