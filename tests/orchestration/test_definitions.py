"""Dagster: the Definitions load, and the whole asset graph materialises on tiny data."""

import json

import dagster as dg
import pytest
from mlflow import MlflowClient

from model_code.layout import Layout
from orchestration.definitions import ALL_CHECKS, defs
from orchestration.jobs import PIPELINE_ASSETS
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource


def test_definitions_load_and_jobs_resolve():
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert {"full_pipeline", "encode_corpus", "process_incoming_batch", "incremental_update", "full_retrain",
            "milvus_gc"} <= jobs
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"corpus", "pseudo_queries", "hard_negatives", "corpus_tree", "encoder", "corpus_shards",
                    "retriever_index",
                    "evaluation", "registered_model", "incoming_batch", "batch_queries", "drift_report",
                    "champion_update"}
    assert {s.name for s in defs.sensors} == {"inbox_sensor", "drift_sensor", "failure_sensor"}
    assert [s.name for s in defs.schedules] == ["milvus_gc_schedule"]


def test_every_job_that_runs_the_pipeline_waits_for_the_others():
    """Before: a full_pipeline run beside a retrain registered its own index under the retrain's
    ingest summary, claiming batches that index lacks (so they were never applied). Every job
    that writes the pipeline's workspace carries the tag the instance runs one at a time."""
    from pathlib import Path

    import yaml

    from orchestration.jobs import DEPLOYMENT_TAG

    config = yaml.safe_load((Path(__file__).parents[2] / "orchestration" / "dagster.yaml").read_text())
    assert {"key": DEPLOYMENT_TAG, "limit": 1} in config["concurrency"]["runs"]["tag_concurrency_limits"]
    writing = [job for job in defs.resolve_all_job_defs()  # the UI's implicit job ("Materialize all") has no tags
               if dg.AssetKey("corpus") in job.asset_layer.executable_asset_keys and job.name != "__ASSET_JOB"]
    assert {job.name for job in writing} == {"full_pipeline", "full_retrain"}
    assert all(job.tags.get(DEPLOYMENT_TAG) for job in writing)


@pytest.mark.parametrize("backend", ["faiss", "milvus"])
def test_the_gc_schedule_runs_only_where_the_params_keep_the_index_in_milvus(tmp_path, backend):
    import yaml

    from orchestration.maintenance import milvus_gc_schedule
    from tests.conftest import REPOSITORY

    params = yaml.safe_load((REPOSITORY / "params.yaml").read_text())
    params["index"]["backend"] = backend
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    context = dg.build_schedule_context(resources={"params": ParamsResource(path=str(tmp_path / "params.yaml")),
                                                   "workspace": WorkspaceResource(root=str(tmp_path))})
    [tick] = list(milvus_gc_schedule.evaluate_tick(context).run_requests or [None])
    if backend == "milvus":
        assert isinstance(tick, dg.RunRequest) and milvus_gc_schedule.job_name == "milvus_gc"
    else:
        assert tick is None and "index.backend is faiss" in milvus_gc_schedule.evaluate_tick(context).skip_message


def test_materialize_whole_graph(workspace, mlflow_uri):
    uri = mlflow_uri
    result = dg.materialize(
        [*PIPELINE_ASSETS, *ALL_CHECKS],
        resources={
            "params": ParamsResource(path=str(workspace / "params.yaml")),
            "workspace": WorkspaceResource(root=str(workspace)),
            "mlflow_store": MlflowResource(tracking_uri=uri),
        },
        # the HCE configuration, selected per run through the encoder asset's config
        run_config={"ops": {"encoder": {"config": {"overrides": "{train: {max_steps: 2, method: hce, hce: {mode: J}}}"}}}},
    )
    assert result.success
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert materialized == {"corpus", "pseudo_queries", "hard_negatives", "corpus_tree", "encoder", "retriever_index",
                            "evaluation", "registered_model"}
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"corpus_expectations": True, "corpus_schema": True}
    layout = Layout(workspace)
    train = json.loads((layout.train_report / "metrics.json").read_text())
    assert train["steps"] == 2 and [r["round"] for r in train["rounds"]] == [0, 1]  # HCE override applied
    assert (layout.final_tree / "tree.npz").exists()
    metadata = result.asset_materializations_for_node("evaluation")[0].metadata
    assert "ndcg@10" in metadata and metadata["queries"].value == 12
    registration = json.loads((layout.registry_report / "registration.json").read_text())
    assert registration["alias"] == "champion"
    assert MlflowClient(tracking_uri=uri).get_model_version_by_alias("test-retriever", "champion").run_id == registration["run_id"]


KIND_SECTIONS = {
    "bm25": {"retriever": {"kind": "bm25"}},
    # self-contrastive MLR trained with one mined BM25 negative per query: the hard_negatives asset feeds the encoder
    "mlr": {"train": {"data": "supervised", "hard_negatives": 1},
            "retriever": {"kind": "mlr", "mlr": {"layers": [2, 1], "pooling": "self_contrastive"}}},
    "svdr": {"retriever": {"kind": "svdr"}},
}


@pytest.mark.parametrize("kind", sorted(KIND_SECTIONS))
def test_materialize_another_kind(tmp_path, beir_dir, tiny_model_dir, kind, mlflow_uri):
    """The same asset graph with retriever.kind bm25 (nothing is trained, the lexical retriever is
    evaluated and registered), mlr (mined negatives, the self-contrastive objective, an index of
    the last layer alone) or svdr (no corpus tree; the sparse encoder trained with the SVDR loss,
    the binary token index built from its tokenizer)."""
    import yaml

    from tests.conftest import tiny_params

    root = tmp_path / f"{kind}-workspace"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir, **KIND_SECTIONS[kind])))
    uri = mlflow_uri
    result = dg.materialize(
        [*PIPELINE_ASSETS, *ALL_CHECKS],
        resources={"params": ParamsResource(path=str(root / "params.yaml")), "workspace": WorkspaceResource(root=str(root)),
                   "mlflow_store": MlflowResource(tracking_uri=uri)},
    )
    assert result.success
    assert result.asset_materializations_for_node("retriever_index")[0].metadata["kind"].value == kind
    layout = Layout(root)
    manifest = json.loads((layout.retriever / "manifest.json").read_text())
    if kind == "bm25":
        assert result.asset_materializations_for_node("encoder")[0].metadata["used"].value is False
    else:
        assert json.loads((layout.train_report / "metrics.json").read_text())["steps"] == 3
    if kind == "mlr":
        assert json.loads((layout.hard_negatives / "summary.json").read_text())["queries"] > 0
        assert manifest["rows"] == manifest["documents"] == 48  # the last layer alone
    if kind == "svdr":
        assert json.loads((layout.hierarchy / "not_used.json").read_text())["reason"].endswith("uses no corpus tree")
        assert (layout.encoder / "svdr_norms.pt").is_file()
        assert manifest["svdr"]["search"] == "beta" and manifest["documents"] == 48
    registration = json.loads((layout.registry_report / "registration.json").read_text())
    assert (registration["retriever"], registration["alias"]) == (kind, "champion")
