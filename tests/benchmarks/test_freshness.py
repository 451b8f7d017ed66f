"""The freshness benchmark's threshold calibration (``benchmarks.freshness``): the rule on hand-made
statistics against a hand computation, and a tiny end-to-end run in which nothing before the
choice can read the test qrels."""

import json
import math
import sysconfig
from pathlib import Path

import pytest
import yaml

from benchmarks import freshness
from benchmarks import run as benchmark_run
from model_code.config import DriftThresholds
from model_code.data import beir as beir_reader
from model_code.data import default_corpus
from tests.conftest import tiny_params, write_beir

IN, OTHER = freshness.IN_DOMAIN, freshness.OTHER


def row(batch, kind, documents, added, ks, cumulative_ks, psi, cumulative_psi, drop=0.0):
    return {"batch": batch, "kind": kind, "documents": documents, "statistics": {
        "batch_documents": documents, "added_since_training": added, "trained_documents": 1000,
        "volume_ratio": added / 1000, "batch_similarity_ks": ks, "cumulative_similarity_ks": cumulative_ks,
        "batch_cluster_psi": psi, "cumulative_cluster_psi": cumulative_psi, "canary_mrr_drop": drop}}


# seven in-domain batches (calibration half: the first 3) and one other-domain batch; min 20 documents
ROWS = [
    row(1, IN, 20, 20, 0.30, 0.30, 0.20, 0.20),
    row(2, IN, 12, 32, 0.90, 0.25, 2.00, 0.33),  # 12 documents: its per-batch KS / PSI are not checked
    row(3, IN, 20, 52, 0.41, 0.20, 0.31, 0.10),
    row(4, IN, 20, 72, 0.95, 0.30, 0.40, 0.20),  # held out: a KS the calibration must not see
    row(5, IN, 20, 92, 0.35, 0.20, 0.30, 0.10, drop=0.5),
    row(6, IN, 20, 112, 0.30, 0.20, 0.30, 0.10),
    row(7, IN, 20, 132, 0.30, 0.20, 0.30, 0.10),
    row(8, OTHER, 20, 152, 0.98, 0.45, 1.10, 0.30),
]
CANARY_RR = [1.0, 0.5, 0.0, 1 / 3, 1.0]


def test_the_rule_by_hand():
    policy = DriftThresholds(max_volume_ratio=0.3, max_unseparable_share=0.15)
    thresholds, inputs = freshness.choose_thresholds(ROWS, CANARY_RR, 20, policy)

    # KS: checked calibration values 0.30, 0.30 | 0.25 (batch 2's 0.90: 12 documents) | 0.41, 0.20
    # -> 0.41 x 1.5 = 0.615 -> 0.62; PSI: 0.20, 0.20 | 0.33 | 0.31, 0.10 -> 0.33 x 1.5 = 0.495 -> 0.50
    assert inputs["calibration_batches"] == [1, 2, 3]
    assert inputs["similarity_ks_max"] == 0.41 and inputs["cluster_psi_max"] == 0.33
    assert thresholds.max_similarity_ks == 0.62 and thresholds.max_cluster_psi == 0.50
    # canary: mean 17/30; squared deviations sum to 0.755556; sd (n - 1) = sqrt(0.755556 / 4) = 0.434613;
    # SE = 0.434613 / sqrt(5) = 0.194365; 2 x SE = 0.388730 -> 0.39 (with sd over n it would be 0.35)
    assert inputs["canary_mrr_standard_error"] == pytest.approx(0.194365, abs=1e-6)
    assert inputs["canary_mrr_at_training"] == pytest.approx(17 / 30) and inputs["canary_queries"] == 5
    assert thresholds.max_canary_mrr_drop == 0.39
    assert thresholds.max_volume_ratio == 0.3 and thresholds.max_unseparable_share == 0.15  # policies kept

    result = freshness.outcomes(ROWS, thresholds, 20)
    assert result["calibration_half"]["retrains"] == 0  # by construction for KS and PSI
    assert result["held_out_half"]["retrain_batches"] == [4, 5]  # KS 0.95 > 0.62, canary drop 0.5 > 0.39
    assert result["held_out_half"]["reasons"]["4"] == ["batch_similarity_ks 0.9500 > 0.62"]
    [other] = result["other_domain"]
    assert other["decision"] == "retrain" and other["detected_by_batch_statistics"]


def test_the_rule_rounds_up_and_caps():
    assert freshness.round_up(0.62) == 0.62 and freshness.round_up(0.6201) == 0.63 and freshness.round_up(0.3) == 0.3
    rows = [row(1, IN, 20, 20, 0.9, 0.9, 0.2, 0.2), row(2, IN, 20, 40, 0.1, 0.1, 0.2, 0.2)]
    thresholds, _ = freshness.choose_thresholds(rows, [1.0, 0.0], 20, DriftThresholds())
    assert thresholds.max_similarity_ks == 1.0  # 0.9 x 1.5 capped at KS's maximum
    with pytest.raises(ValueError, match="no calibration batch"):
        freshness.choose_thresholds([row(1, IN, 5, 5, 0.1, 0.1, 0.1, 0.1)] * 2, [1.0, 0.0], 20, DriftThresholds())


def test_calibration_never_reads_the_test_qrels(tmp_path, tiny_model_dir, monkeypatch):
    data = write_beir(tmp_path / "beir")
    params = tiny_params(data, tiny_model_dir, data={"split_fractions": {"old": 0.6, "new": 0.35, "tune": 0.05}},
                         freshness={"min_batch_documents": 4},
                         eval={"metrics": benchmark_run.METRICS, "top_k": 100})  # benchmarks.run reports these
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    root = tmp_path / "bench"

    reads, calibrating = [], [False]
    real_reader, real_calibrate = beir_reader._read_qrels_tsv, freshness.calibrate

    def reader(path):
        reads.append((calibrating[0], Path(path).name))
        if calibrating[0] and Path(path).name == "test.tsv":
            raise AssertionError(f"the calibration read the test qrels: {path}")
        return real_reader(path)

    def calibrate(*args, **kwargs):
        calibrating[0] = True
        try:
            result = real_calibrate(*args, **kwargs)
        finally:
            calibrating[0] = False
        # nothing the calibration wrote holds test judgements
        assert not [p for p in root.rglob("test.parquet")] and not [p for p in root.rglob("test.tsv")]
        return result

    monkeypatch.setattr(beir_reader, "_read_qrels_tsv", reader)
    monkeypatch.setattr(freshness, "calibrate", calibrate)
    # the other-domain batches' docstrings from three standard-library packages, not the whole standard
    # library and numpy, pandas and scipy (a scan of 20-odd CPU-seconds; the corpus is not what this checks)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    monkeypatch.setattr(default_corpus, "source_roots", lambda packages: [stdlib / "email", stdlib / "json", stdlib / "http"])
    out = tmp_path / "results"
    assert freshness.main(["--data", str(data), "--params", str(tmp_path / "params.yaml"), "--batch-size", "4",
                           "--workdir", str(root), "--out", str(out)]) == 0
    assert (True, "train.tsv") in reads and (True, "test.tsv") not in reads  # the reader served the calibration
    assert (False, "test.tsv") in reads  # and the test report afterwards

    result = json.loads((out / "beir" / "freshness-calibration.json").read_text())
    rows = result["batches"]
    kinds = [r["kind"] for r in rows]
    assert kinds == [IN] * 4 + [freshness.MIXED, OTHER]  # 17 new documents in 4 batches, then two others
    assert [r["documents"] for r in rows] == [5, 4, 4, 4, 4, 4]
    assert all(r["observed_decision"] == "incremental" for r in rows)  # observe mode: nothing trips
    assert result["params"]["train"]["enabled"] and result["training"]["steps"] == 3  # a trained champion
    assert result["params"]["eval"]["split"] == "dev" and result["commit"]

    # the chosen thresholds recomputed by hand from the recorded statistics of batches 1 and 2
    assert result["rule"]["calibration_batches"] == [1, 2]
    for statistic, name in (("similarity_ks", "max_similarity_ks"), ("cluster_psi", "max_cluster_psi")):
        values = [r["statistics"][f"{scope}_{statistic}"] for r in rows[:2] for scope in ("batch", "cumulative")]
        expected = math.ceil(round(max(values) * 1.5 / 0.01, 9)) * 0.01
        assert result["thresholds"][name] == pytest.approx(min(expected, 1.0) if name == "max_similarity_ks" else expected)
    se = result["rule"]["canary_mrr_standard_error"]
    assert result["thresholds"]["max_canary_mrr_drop"] == pytest.approx(math.ceil(round(2 * se / 0.01, 9)) * 0.01)
    assert result["rule"]["canary_mrr_at_training"] == pytest.approx(rows[0]["statistics"]["canary_mrr@10_at_training"])
    assert result["thresholds"]["max_volume_ratio"] == params.get("freshness", {}).get("thresholds", {}).get(
        "max_volume_ratio", DriftThresholds().max_volume_ratio)
    assert result["outcomes"]["held_out_half"]["batches"] == 2 and len(result["outcomes"]["other_domain"]) == 2
    # test MRR is reported per batch, after the choice
    assert all("test_old_mrr@10" in r for r in rows) and result["metrics"]["test_old_queries"] > 0
