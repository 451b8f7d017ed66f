"""``benchmarks.freshness_latency``: a tiny run of two kinds through the production path, checked
against what the workspaces hold afterwards (the versions' manifests, the indexed ids) and against
the pipeline's own hash split of the documents."""

import json

import pandas as pd
import pytest
import yaml

from benchmarks import freshness_latency
from benchmarks import run as benchmark_run
from benchmarks.report import write_results_table
from model_code.config import Params
from model_code.freshness.deployment import checkout
from model_code.layout import Layout
from model_code.versions.chain import RetrieverVersions
from tests.conftest import tiny_params, write_beir
from tracking.deployment import MlflowRegistry


def test_each_kind_gets_the_same_new_documents_and_its_timings_are_its_versions(tmp_path, tiny_model_dir):
    data = write_beir(tmp_path / "beir")
    params = tiny_params(data, tiny_model_dir, data={"split_fractions": {"old": 0.6, "new": 0.35, "tune": 0.05}},
                         eval={"metrics": benchmark_run.METRICS, "top_k": 100})  # benchmarks.run reports these
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    root, out = tmp_path / "work", tmp_path / "results"
    assert freshness_latency.main(["--data", str(data), "--params", str(tmp_path / "params.yaml"), "--kinds", "dense",
                                   "svdr", "--batches", "2", "--batch-size", "3", "--workdir", str(root),
                                   "--out", str(out)]) == 0
    result = json.loads((out / "beir" / "freshness-latency.json").read_text())
    assert set(result["kinds"]) == {"dense", "svdr"} and result["commit"]

    # the new documents, in corpus order, as the pipeline's hash split assigned them (the probe's ingest)
    groups = pd.read_parquet(Layout(root / "probe").ingested / "doc_groups.parquet")
    corpus = [json.loads(line)["_id"] for line in (data / "corpus.jsonl").read_text().splitlines()]
    new = [d for d in corpus if d in set(groups.loc[groups["group"] == "new", "doc_id"])]
    for kind, measured in result["kinds"].items():
        assert result["params"][kind]["retriever"]["kind"] == kind and not result["params"][kind]["train"]["enabled"]
        versions = deployed(root, kind, result["params"][kind])
        manifests = versions.manifests()
        assert [m["doc_ids"] for m in manifests] == [new[0:3], new[3:6]]  # one version per batch, nothing else
        assert set(new[:6]) <= set(versions.load().live_ids())
        for batch, manifest in zip(measured["batches"], manifests):
            assert batch["documents"] == 3
            assert batch["update_s"] == pytest.approx(manifest["total_ms"] / 1000)
            assert batch["searchable_s"] == pytest.approx(batch["drift_report_s"] + batch["update_s"])
            assert batch["registered_s"] >= batch["searchable_s"]
        assert measured["searchable_s_median"] == measured["batches"][1]["searchable_s"]  # the first left out
    assert "encode_ms_per_doc" in deployed(root, "dense", result["params"]["dense"]).manifests()[0]
    assert "encode_ms_per_doc" not in deployed(root, "svdr", result["params"]["svdr"]).manifests()[0]  # tokenizer only

    write_results_table(out, tmp_path / "RESULTS.md")
    table = (tmp_path / "RESULTS.md").read_text()
    assert "| beir | dense | 2 x 3 |" in table and "| beir | svdr | 2 x 3 |" in table


def deployed(root, kind, params) -> RetrieverVersions:
    """The versions of the registered champion of ``kind``'s workspace (where its updates went)."""
    layout = Layout(root / kind)
    registry = MlflowRegistry(Params.model_validate(params), layout, f"sqlite:///{root / f'mlflow-{kind}.db'}")
    return RetrieverVersions(checkout(registry, layout)[0])
