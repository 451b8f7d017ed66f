"""benchmarks.svdr_index on tiny data: the results file's fields, and the build ratio is the two
measured speeds' quotient at 256 tokens."""

import json

import pytest

from benchmarks import svdr_index


def test_the_index_benchmark_records_both_builds_additions_and_latency(tmp_path, beir_dir, tiny_model_dir):
    out = tmp_path / "results"
    assert svdr_index.main(["--data", str(beir_dir), "--out", str(out), "--allow-dirty", "--model", str(tiny_model_dir),
                            "--sample", "30", "--lengths", "256", "16", "--repeats", "2", "--added", "10",
                            "--queries", "2"]) == 0
    result = json.loads((out / "beir" / "svdr-index.json").read_text())
    builds, metrics = result["builds"], result["metrics"]
    assert set(builds) == {"256", "16"}
    for row in builds.values():
        assert row["binary"]["documents"] == row["dense"]["documents"] == 30  # the same sample for both
        assert row["binary_whole_corpus"]["documents"] == 48
        assert row["build_speedup_vs_dense"] == pytest.approx(
            row["binary"]["docs_per_s"] / row["dense"]["docs_per_s"], abs=0.005)  # recorded to 2 decimals
        assert row["binary"]["disk_mb"] > 0 and row["dense"]["memory_mb"] == pytest.approx(30 * 32 * 4 / 2**20, abs=1e-3)
    assert metrics["build_speedup_vs_dense"] == builds["256"]["build_speedup_vs_dense"]
    assert metrics["build_speedup_vs_dense_at_16"] == builds["16"]["build_speedup_vs_dense"]
    assert metrics["binary_docs_per_s_at_256"] == builds["256"]["binary"]["docs_per_s"]
    # the tiny texts are shorter than 16 tokens' worth of words only at 16: fewer tokens kept there
    assert builds["16"]["binary"]["tokens_per_document"] < builds["256"]["binary"]["tokens_per_document"]
    additions = result["additions"]
    assert (additions["index_documents"], additions["added_documents"]) == (38, 10)
    assert (additions["batch_20"]["batches"], additions["batch_1"]["batches"]) == (1, 10)
    assert metrics["add_ms_per_doc_batch_1"] == additions["batch_1"]["ms_per_doc_median"] > 0
    assert {f"query_ms_{m}" for m in ("full", "alpha", "beta", "beta_rerank10", "beta_rerank100")} <= set(metrics)
    assert result["query_latency"]["queries"] == 2
    assert set(result["load_average"]) == {"start", "end"} and result["dirty"] == result["commit"].endswith("+dirty")
    assert result["params"]["retriever"]["kind"] == "svdr" and result["params"]["encoder"]["model"] == str(tiny_model_dir)
    assert result["sample"]["documents"] == 30 and result["sample"]["corpus_documents"] == 48
