"""Decisions never see the test split: with the test qrels gone after ingestion, training (its
dev-based selection), IncDSI's tuning, the drift report's canary and the incremental update all
still run, and the canary's queries are dev queries. (Promotion: tests/tracking/test_registry.py; the
sweep: tests/benchmarks/test_sweep.py; threshold calibration: tests/benchmarks/test_freshness.py.)"""

import json

import pandas as pd
import yaml

from model_code.cli import main
from model_code.config import load_params
from model_code.data.ingested import load_ingested
from model_code.freshness import report as drift_report
from model_code.freshness.drift import DriftReference
from model_code.layout import Layout
from model_code.versions.apply import add_documents
from model_code.versions.chain import RetrieverVersions
from tests.conftest import tiny_params


def test_training_tuning_and_the_freshness_loop_run_without_the_test_qrels(tmp_path, beir_dir, tiny_model_dir):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(
        beir_dir, tiny_model_dir, retriever={"kind": "incdsi"}, freshness={"min_batch_documents": 2})))
    args = ["--params", str(root / "params.yaml"), "--root", str(root)]
    layout, params = Layout(root), load_params(root / "params.yaml")
    assert main(["ingest", *args]) == 0
    (layout.ingested / "qrels" / "test.parquet").unlink()
    for stage in ("querygen", "mine-negatives", "cluster", "train", "index"):
        assert main([stage, *args]) == 0, stage
    assert json.loads((layout.retriever / "head" / "addition.json").read_text())["source"] == "tuned"

    data = load_ingested(layout.ingested)
    assert "test" not in data.qrels and len(data.qrels_for("dev"))
    batch = pd.DataFrame({"doc_id": ["new-1", "new-2", "new-3"], "title": ["comet orbit", "chord tempo", "dough oven"],
                          "text": ["a comet on a long orbit", "a chord at a slow tempo", "dough rises in the oven"]})
    report = drift_report.run(params, layout, "base", data, batch, tmp_path / "report",
                              passage_text=drift_report.PASSAGE_TEXT)
    assert report["documents"] == 3 and "canary_mrr_drop" in report["statistics"]
    canary = DriftReference.load(drift_report.reference_dir(layout)).canary_qrels
    assert canary and set(canary) <= set(data.qrels_for("dev")["query_id"])

    batch_file = tmp_path / "batch.jsonl"
    batch_file.write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n"
                                  for d, t, x in batch.itertuples(index=False)))
    add_documents(layout, params, batch_file)
    assert {"new-1", "new-2", "new-3"} <= set(RetrieverVersions(layout).load().live_ids())
