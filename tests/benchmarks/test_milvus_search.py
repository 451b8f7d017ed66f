"""benchmarks.milvus_search on a tiny Milvus Lite file: each row's recall is measured against exact
search in NumPy (benchmarks.scale.exact_top_k, independent of Milvus), and the batched measure is one
call of the first queries whose share per query is the call's time over their number."""

import json

import pytest

from benchmarks import milvus_search


def test_the_search_benchmark_measures_single_and_batched_queries_against_exact_search(tmp_path):
    out = tmp_path / "results"
    milvus_search.main(["--sizes", "300", "--modes", "lite", "--index-types", "FLAT", "--dim", "16",
                        "--queries", "12", "--min-queries", "12", "--clusters", "5", "--write-sets", "4",
                        "--updates", "1", "--batch", "8", "--out", str(out), "--allow-dirty"])
    report = json.loads((out / "milvus.json").read_text())
    (row,) = report["measures"]["milvus-lite-flat"]
    assert (row["documents"], row["queries"], row["write_sets"], row["updates"]) == (300, 12, 4, 1)
    assert row["recall_at_10"] == row["many_write_sets"]["recall_at_10"] == 1.0  # FLAT is exact
    batched = row["batched"]
    assert batched["queries"] == 8 and batched["recall_at_10"] == 1.0
    assert batched["call_ms_p50"] > 0 and batched["ms_per_query"] == pytest.approx(batched["call_ms_p50"] / 8)
    (line,) = [line for line in (out / "milvus.md").read_text().splitlines() if line.startswith("| milvus-lite-flat | 300 |")]
    assert f"{batched['ms_per_query']:.1f} ({batched['call_ms_p50']:.0f} for 8, recall 1.000)" in line
    assert row["commit_log_read_ms"] > 0 and line.split("|")[-3].strip() == f"{row['commit_log_read_ms']:.1f}"
