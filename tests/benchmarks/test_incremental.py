"""The IncDSI benchmark protocol: queries scored on all their relevant documents, held-out
generated queries never used for additions, the paper's mean speed, and a like-for-like run on
tiny data (one D0 encoder for every method, several addition orders, the full-rows re-run)."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from benchmarks import incremental
from model_code.data.ingested import IngestedData


def test_a_query_is_scored_on_every_relevant_document_and_grouped_by_them():
    qrels = pd.DataFrame({"query_id": ["q1", "q1", "q2", "q3", "q4"], "doc_id": ["o1", "n1", "o2", "t1", "o3"],
                          "relevance": [1, 1, 1, 1, 0]})
    data = IngestedData(corpus=pd.DataFrame(), queries=pd.DataFrame(), qrels={"test": qrels})
    groups = {"o1": "old", "o2": "old", "o3": "old", "n1": "new", "t1": "tune"}
    vectors = {q: torch.tensor([float(i), 0.0]) for i, q in enumerate(["q1", "q2", "q3", "q4"])}
    before = incremental.natural_queries(data, groups, vectors, {"o1", "o2", "o3"}, set())
    # q1 waits for n1; q3's document (tune) is never indexed; q4 has no relevant document
    assert (before["old"].ids, before["new"].ids) == (["q2"], [])
    after = incremental.natural_queries(data, groups, vectors, {"o1", "o2", "o3", "n1"}, {"n1"})
    assert (after["old"].ids, after["new"].ids) == (["q2"], ["q1"])
    assert after["new"].qrels == {"q1": {"o1": 1, "n1": 1}}  # both relevant documents count

    def search(query_vectors):  # q1 finds its *old* relevant document first: a hit
        return np.array([[2.0, 1.0]]), [["o1", "x"]]

    per_query = incremental.scores(search, after["new"])
    assert per_query.loc["q1"].tolist() == [1.0, 1.0, 1.0]  # hits@1, hits@10, mrr@10


def test_each_new_documents_last_generated_query_is_held_out_from_its_addition():
    generated = pd.DataFrame({"doc_id": ["a", "a", "a", "b", "c", "c"], "query": ["a1", "a2", "a3", "b1", "c1", "c2"]})
    additions, held = incremental.held_out_generated(generated, ["a", "b"])
    assert additions["query"].tolist() == ["a1", "a2", "b1"]  # b has one query: it keeps it to be added
    assert held["query"].tolist() == ["a3"]  # and c is not new


def test_speed_is_reported_as_the_paper_does_beside_median_and_p95():
    figures = incremental.speed([1.0, 2.0, 9.0, 4.0])
    assert figures["add_ms_mean"] == 16.0 / 4 and figures["add_ms_median"] == 3.0
    assert figures["add_ms_p95"] == np.percentile([1, 2, 4, 9], 95)


def test_incdsi_is_compared_with_each_method_on_the_same_queries():
    """By hand: old q1 1.0 vs 1.0, q2 0.5 vs 0.0 (the other method's rows in another order): IncDSI
    0.25 above, one query better, one the same; new: 0.2 vs 1.0 and 1.0 vs 1.0, 0.4 below; a
    group of fewer than two queries (no test possible) is left out."""
    def frame(values):
        return pd.DataFrame(values, index=pd.Index(list(values["mrr@10"]), name="query_id"))

    finals = {
        "incdsi": {"old": frame({"mrr@10": {"q1": 1.0, "q2": 0.5}, "hit_rate@10": {"q1": 1.0, "q2": 1.0}}),
                   "new": frame({"mrr@10": {"q3": 0.2, "q4": 1.0}, "hit_rate@10": {"q3": 1.0, "q4": 1.0}}),
                   "new_unseen": frame({"mrr@10": {"h1": 1.0}, "hit_rate@10": {"h1": 1.0}})},
        "dense-add": {"old": frame({"mrr@10": {"q2": 0.0, "q1": 1.0}, "hit_rate@10": {"q2": 0.0, "q1": 1.0}}),
                      "new": frame({"mrr@10": {"q3": 1.0, "q4": 1.0}, "hit_rate@10": {"q3": 1.0, "q4": 1.0}}),
                      "new_unseen": frame({"mrr@10": {"h1": 0.0}, "hit_rate@10": {"h1": 0.0}})},
    }
    paired = incremental.paired_against(finals, "incdsi")
    assert list(paired) == ["dense-add"]
    assert set(paired["dense-add"]) == {"old_mrr@10", "new_hit_rate@10", "new_mrr@10"}
    old = paired["dense-add"]["old_mrr@10"]
    assert (old["baseline"], old["other"], old["difference"]) == (0.5, 0.75, 0.25)
    assert (old["better"], old["same"], old["worse"]) == (1, 1, 0)
    assert paired["dense-add"]["new_mrr@10"]["difference"] == pytest.approx(-0.4)
    assert paired["dense-add"]["new_hit_rate@10"]["ci95"] == [0.0, 0.0]  # every query the same


def test_the_protocol_runs_like_for_like_on_tiny_data(tmp_path, beir_dir, tiny_model_dir, monkeypatch):
    params = yaml.safe_load((incremental.PROJECT / "params.yaml").read_text())
    params["train"].update(batch_size=8, max_steps=3)  # the tiny corpus has fewer positives than a shipped batch
    params["data"]["dev_fraction"] = 0.2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setattr(incremental, "PROJECT", tmp_path)  # its encoding cache, not the repository's
    out = tmp_path / "results"
    assert incremental.main(["--data", str(beir_dir), "--encoder", str(tiny_model_dir), "--orders", "2",
                             "--trials", "0", "--queries-per-document", "3", "--new-share", "0.3",
                             "--out", str(out), "--allow-dirty"]) == 0
    results = {name: json.loads((out / beir_dir.name / f"{name}.json").read_text())
               for name in ("incdsi-untuned", "dense-add", "head-finetune", "full-retrain")}
    incdsi = results["incdsi-untuned"]
    new = incdsi["protocol"]["documents"]["new"]
    assert incdsi["protocol"]["encoder"].startswith("D0") and incdsi["protocol"]["orders"] == 2
    assert [len(order) for order in incdsi["per_document_ms"]] == [new, new]
    times = [t for order in incdsi["per_document_ms"] for t in order]
    assert abs(incdsi["metrics"]["add_ms_mean"] - sum(times) / len(times)) < 1e-6
    assert incdsi["metrics"]["full_rows"]["max_row_difference"] < 1e-4  # the active set solves the full problem
    for result in results.values():
        assert result["metrics"]["new_unseen_hit_rate@10"] >= 0 and "ci95" in result["intervals"]["old"]["mrr@10"]
    per_query = {name: pd.read_csv(out / beir_dir.name / "per_query" / f"{name}.csv", dtype={"query_id": str})
                 for name in results}
    for name, frame in per_query.items():  # the files hold the values the means were taken over
        for group, rows in frame.groupby("group"):
            assert rows["hit_rate@10"].mean() == pytest.approx(results[name]["metrics"][f"{group}_hit_rate@10"], abs=1e-6)
    for other in ("dense-add", "head-finetune", "full-retrain"):  # IncDSI minus the other, query by query
        mine, theirs = (per_query[n][per_query[n]["group"] == "old"].set_index("query_id")["mrr@10"]
                        for n in ("incdsi-untuned", other))
        assert incdsi["paired"][other]["old_mrr@10"]["difference"] == pytest.approx((mine - theirs).mean(), abs=1e-5)
