"""Ingestion: every source format, validation rejects, parse errors and atomic outputs."""

import hashlib
import json

import datasets
import pandas as pd
import pytest

from model_code.config import DataParams, DefaultCorpusParams, Params
from model_code.data.default_corpus import build_default_corpus
from model_code.data.ingested import load_ingested
from model_code.data.tables import IngestError
from model_code.layout import Layout
from model_code.stages import ingest


def run_ingest(tmp_path, **data):
    layout = Layout(tmp_path / "ws")
    summary = ingest.run(Params(data=DataParams(**data)), layout)
    return summary, layout


def read_rejects(layout):
    return [json.loads(line) for line in (layout.ingest_report / "rejects.jsonl").read_text().splitlines()]


def test_beir_ingest_writes_all_outputs(tmp_path, beir_dir):
    summary, layout = run_ingest(tmp_path, source="beir", path=str(beir_dir), dev_fraction=0.25)
    data = load_ingested(layout.ingested)
    assert len(data.corpus) == 48 and len(data.queries) == 48
    assert set(data.qrels) == {"train", "dev", "test"}
    assert summary["rejected_rows"] == 0 and summary["expectations_success"]
    # dev is carved from train, never overlapping it
    assert not set(data.qrels["dev"]["query_id"]) & set(data.qrels["train"]["query_id"])
    groups = pd.read_parquet(layout.ingested / "doc_groups.parquet")
    assert groups["group"].value_counts().to_dict() == {"old": 43, "new": 4, "tune": 1}
    assert (layout.ingest_report / "data_docs" / "index.html").exists()
    assert json.loads((layout.ingest_report / "expectations.json").read_text())["success"] is True


def test_ingest_is_deterministic(tmp_path, beir_dir):
    _, first = run_ingest(tmp_path / "a", source="beir", path=str(beir_dir))
    _, second = run_ingest(tmp_path / "b", source="beir", path=str(beir_dir))
    for name in ("qrels/dev.parquet", "doc_groups.parquet", "query_groups.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(first.ingested / name), pd.read_parquet(second.ingested / name))


def test_bad_rows_are_rejected_with_reasons(tmp_path, beir_dir):
    with open(beir_dir / "corpus.jsonl", "a") as handle:
        handle.write(json.dumps({"_id": "astronomy-0", "title": "dup", "text": "duplicate id"}) + "\n")
        handle.write(json.dumps({"_id": "empty-doc", "title": "t", "text": "   "}) + "\n")
        handle.write(json.dumps({"title": "no id", "text": "x"}) + "\n")
    with open(beir_dir / "qrels" / "train.tsv", "a") as handle:
        handle.write("q-astronomy-1\tno-such-doc\t1\r\nq-astronomy-1\tastronomy-1\thigh\r\n")
    summary, layout = run_ingest(tmp_path, source="beir", path=str(beir_dir))
    rejects = read_rejects(layout)
    by_line = {(r["source"], r["line"]): r for r in rejects}
    assert by_line[("corpus.jsonl", 49)]["reason"] == "doc_id: duplicate id (an earlier row has it)"
    assert by_line[("corpus.jsonl", 50)]["field"] == "text"
    assert by_line[("corpus.jsonl", 51)]["reason"] == "missing field '_id'"
    assert ("train.tsv", 38) not in by_line  # a document missing from the corpus: kept and counted, as BEIR does
    assert sum(summary["qrels_missing_documents"].values()) == 1
    assert by_line[("train.tsv", 39)]["reason"] == "relevance: relevance must be an integer"
    assert summary["rejected_rows"] == len(rejects) == 4
    corpus = load_ingested(layout.ingested).corpus
    assert "empty-doc" not in set(corpus["doc_id"]) and len(corpus) == 48
    assert corpus.set_index("doc_id").loc["astronomy-0", "title"] != "dup"  # first occurrence kept


def test_malformed_json_stops_with_file_and_line_and_leaves_no_outputs(tmp_path, beir_dir):
    lines = (beir_dir / "corpus.jsonl").read_text().splitlines()
    lines[6] = '{"_id": "broken", "text": '
    (beir_dir / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    layout = Layout(tmp_path / "ws")
    with pytest.raises(IngestError, match=r"corpus\.jsonl:7: malformed JSON"):
        ingest.run(Params(data=DataParams(source="beir", path=str(beir_dir))), layout)
    assert not layout.ingested.exists() and not layout.ingest_report.exists()
    assert not [p for p in layout.root.rglob("*") if p.is_file()], "no partial files may be left"


def test_a_source_whose_every_row_is_rejected_names_the_first_reject(tmp_path, beir_dir):
    """Before: "no valid documents (48 rows rejected)", with no file, line or reason anywhere (the
    rejects file is written after the check)."""
    lines = (beir_dir / "corpus.jsonl").read_text().splitlines()
    (beir_dir / "corpus.jsonl").write_text("".join(json.dumps({**json.loads(line), "_id": n}) + "\n"
                                                   for n, line in enumerate(lines)))
    with pytest.raises(IngestError, match=r"no valid documents in the beir source \(48 rows rejected; first: "
                                          r"corpus\.jsonl:1: field '_id' must be a string, got int\)"):
        ingest.run(Params(data=DataParams(source="beir", path=str(beir_dir))), Layout(tmp_path / "ws"))


def test_failed_rerun_keeps_previous_outputs(tmp_path, beir_dir):
    _, layout = run_ingest(tmp_path, source="beir", path=str(beir_dir))
    before = (layout.ingested / "corpus.parquet").read_bytes()
    (beir_dir / "qrels" / "test.tsv").write_text("q1\tonly-two-fields\n")
    with pytest.raises(IngestError, match=r"test\.tsv:1: expected 3 tab-separated fields"):
        ingest.run(Params(data=DataParams(source="beir", path=str(beir_dir))), layout)
    assert (layout.ingested / "corpus.parquet").read_bytes() == before


def test_parquet_source(tmp_path, beir_dir):
    source = tmp_path / "pq"
    (source / "qrels").mkdir(parents=True)
    pd.read_json(beir_dir / "corpus.jsonl", lines=True, dtype=str).to_parquet(source / "corpus.parquet")
    pd.read_json(beir_dir / "queries.jsonl", lines=True, dtype=str).to_parquet(source / "queries.parquet")
    pd.read_csv(beir_dir / "qrels" / "test.tsv", sep="\t", dtype={"score": int}).to_parquet(
        source / "qrels" / "test.parquet"
    )
    summary, _ = run_ingest(tmp_path, source="parquet", path=str(source))
    assert summary["documents"] == 48 and summary["qrels"] == {"test": 12}


def test_hf_saved_dataset_and_local_file(tmp_path, beir_dir):
    corpus = pd.read_json(beir_dir / "corpus.jsonl", lines=True, dtype=str)
    queries = pd.read_json(beir_dir / "queries.jsonl", lines=True, dtype=str)
    qrels = pd.read_csv(beir_dir / "qrels" / "train.tsv", sep="\t", dtype={"score": int})
    saved = tmp_path / "hf"
    datasets.DatasetDict(
        {
            "corpus": datasets.Dataset.from_pandas(corpus),
            "queries": datasets.Dataset.from_pandas(queries),
            "qrels_train": datasets.Dataset.from_pandas(qrels),
        }
    ).save_to_disk(str(saved))
    summary, _ = run_ingest(tmp_path / "a", source="hf", path=str(saved), dev_fraction=0.0)
    assert summary["documents"] == 48 and summary["qrels"] == {"train": 36}
    summary, _ = run_ingest(tmp_path / "b", source="hf", path=str(beir_dir / "corpus.jsonl"))
    assert summary["documents"] == 48 and summary["queries"] == 0


def test_missing_source_path_is_a_clear_error(tmp_path):
    with pytest.raises(IngestError, match="does not exist"):
        run_ingest(tmp_path, source="beir", path=str(tmp_path / "nowhere"))


def test_default_corpus_is_real_and_deterministic():
    """One build (a scan of the standard library and packages takes most of a minute): nothing in it
    depends on the order files are read in. The documents come in name order, and the test split is a
    content hash of each name (recomputed here), not a draw."""
    params = DefaultCorpusParams(max_documents=3000)
    first = build_default_corpus(params)
    assert len(first.corpus) == 3000
    ids = first.corpus["doc_id"].tolist()
    assert ids == sorted(ids)

    def hashed_share(name: str) -> float:
        return int(hashlib.blake2b(f"test:{name}".encode(), digest_size=8).hexdigest(), 16) / 16**16

    assert set(first.qrels["test"]["doc_id"]) == {d for d in ids if hashed_share(d) < params.test_fraction}
    assert first.queries["text"].str.lower().is_unique  # ambiguous summaries were dropped
    row = first.corpus.set_index("doc_id").loc[first.qrels["train"]["doc_id"].iloc[0]]
    assert row["text"].startswith(row["title"])  # document = qualified name + signature + body
