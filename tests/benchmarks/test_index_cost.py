"""benchmarks.index_cost on a tiny BEIR folder with the real MiniLM: the multi-vector index holds m
rows per document and about m times the bytes of the single-vector one, and the table shows it."""

import json

import pytest

from benchmarks import index_cost
from benchmarks import run as benchmark_run


def test_the_multi_vector_index_holds_m_rows_per_document_and_m_times_the_bytes(tmp_path, beir_dir, monkeypatch):
    monkeypatch.setattr(benchmark_run, "code_version", lambda results=None: "abc1234")
    out = tmp_path / "results"
    assert index_cost.main(["--data", str(beir_dir), "--configs", "ct-hn", "mlr-multi-4",
                            "--sample", "24", "--queries", "8", "--out", str(out)]) == 0
    row = json.loads((out / "beir" / "index-cost.json").read_text())
    single, four = (row["configs"][c] for c in ("ct-hn", "mlr-multi-4"))
    assert single["documents"] == four["documents"] == 24  # the same sample for both
    assert (single["rows"], four["rows"]) == (24, 96)  # N and N*4 (MLR multi: one row per layer)
    assert four["index_mb"] / single["index_mb"] == pytest.approx(4, rel=0.1)
    assert single["latency_ratio"] == 1.0 and all(r["ms_per_query_batch_1"] > 0 and r["ms_per_query_batch_64"] > 0
                                                  for r in (single, four))
    assert row["params"]["mlr-multi-4"]["retriever"]["mlr"]["layers"] == [6, 5, 4, 3]
    assert not any(p["train"]["enabled"] for p in row["params"].values())  # base encoders: nothing trained
    table = (out.parent / "RESULTS.md").read_text()
    assert "| beir | mlr-multi-4 | mlr | 24 | 96 |" in table


def test_a_sample_larger_than_the_corpus_is_an_error_naming_both(tmp_path, beir_dir):
    with pytest.raises(ValueError, match="--sample 5000: the corpus has 48 documents"):
        index_cost.sampled_beir(beir_dir, 5000, 0, tmp_path / "sample")
