"""MLflow: run logging, registration by run id, alias promotion and the pyfunc retriever."""

import json

import mlflow
import pytest
import yaml
from mlflow import MlflowClient

from model_code.cli import main
from model_code.config import load_params
from model_code.freshness.deployment import rollback
from model_code.layout import Layout
from tracking.deployment import MlflowRegistry
from tracking.registry import decide_alias, log_training_curves, register


@pytest.fixture
def pipeline_outputs(workspace):
    assert main(["all", "--params", str(workspace / "params.yaml"), "--root", str(workspace)]) == 0
    return workspace


def test_alias_rule():
    assert decide_alias(0.5, None, 0.0)[0] == "champion"
    assert decide_alias(0.5, 0.4, 0.0)[0] == "champion"
    assert decide_alias(0.5, 0.5, 0.0)[0] == "challenger"
    assert decide_alias(0.5, 0.45, 0.1)[0] == "challenger"


def test_register_promote_and_serve(pipeline_outputs, mlflow_uri):
    root = pipeline_outputs
    layout = Layout(root)
    params = load_params(root / "params.yaml")
    uri = mlflow_uri

    first = register(params, layout, tracking_uri=uri)
    assert (first["version"], first["alias"], first["decision_split"]) == (1, "champion", "dev")
    assert first["reported"]["split"] == "test"  # test is reported from the evaluate stage, not decided on
    # the same model again: the champion is re-evaluated on the same dev queries and scores exactly
    # the challenger's own value, so it is not better
    second = register(params, layout, tracking_uri=uri)
    assert (second["version"], second["alias"]) == (2, "challenger")
    assert second["previous_champion_value"] == second["value"] == first["value"]
    # a better retriever: the lexical kind on these topical queries (retrieval by their own words)
    bm25 = load_params(root / "params.yaml", {"retriever": {"kind": "bm25"}})
    (root / "params.yaml").write_text(yaml.safe_dump(yaml.safe_load((root / "params.yaml").read_text())
                                                     | {"retriever": {"kind": "bm25"}}))
    for stage in ("index", "evaluate"):
        assert main([stage, "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    (layout.ingested / "qrels" / "test.parquet").unlink()  # promotion never reads the test split
    third = register(bm25, layout, tracking_uri=uri)
    assert third["value"] > first["value"] and (third["version"], third["alias"]) == (3, "champion")

    client = MlflowClient(tracking_uri=uri)
    name = params.registry.model_name
    assert int(client.get_model_version_by_alias(name, "champion").version) == 3
    assert int(client.get_model_version_by_alias(name, "challenger").version) == 2
    assert client.get_model_version_by_alias(name, "champion").run_id == third["run_id"]
    run = client.get_run(third["run_id"])
    assert run.data.metrics["dev.ndcg_at_10"] == pytest.approx(third["value"])
    assert run.data.metrics["champion.dev.ndcg_at_10"] == pytest.approx(first["value"], abs=1e-9)
    assert client.get_model_version(name, "3").tags["decision_split"] == "dev"
    assert "decided_on_reported_split" not in client.get_model_version(name, "3").tags  # decided on dev, reports test
    history = client.get_metric_history(first["run_id"], "train.loss")
    assert [m.step for m in history] == [1, 2, 3]
    assert json.loads((layout.registry_report / "registration.json").read_text())["version"] == 3

    mlflow.set_tracking_uri(uri)
    registry = MlflowRegistry(params, layout, uri)
    assert rollback(registry, layout) == {"from_version": 3, "to_version": 1, "reverted_batches": [],
                                          "reverted_as": "excluded", "restored_batches": []}  # full trainings: no batch
    assert int(client.get_model_version_by_alias(name, "champion").version) == 1
    with pytest.raises(ValueError, match="replaced no earlier champion"):
        rollback(registry, layout)
    rollback(registry, layout, to_version="3")
    model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    result = model.predict(["astronomy stars 0", "cooking recipe 0"], params={"k": 5})
    assert list(result.columns) == ["query", "doc_ids", "scores", "model_version"]  # None: loaded outside fresh-registry serve
    assert all(len(ids) == 5 for ids in result["doc_ids"])
    assert all(list(s) == sorted(s, reverse=True) for s in result["scores"])


def test_the_champion_is_re_measured_on_the_challengers_data(pipeline_outputs, mlflow_uri):
    """Before: a challenger was compared with the metric logged when the champion was registered,
    measured on other data (a retrain adds every accepted batch to the corpus)."""
    root = pipeline_outputs
    layout = Layout(root)
    uri = mlflow_uri
    first = register(load_params(root / "params.yaml"), layout, tracking_uri=uri)
    assert first["alias"] == "champion"
    # the same model decided on other queries (the train split): other data, as a retrain brings
    params = load_params(root / "params.yaml", {"registry": {"decision_split": "train"}})
    second = register(params, layout, tracking_uri=uri)
    assert second["value"] != pytest.approx(first["value"])  # the two data sets really score differently
    assert second["previous_champion_value"] == pytest.approx(second["value"], abs=1e-9)  # not the logged value
    assert second["alias"] == "challenger"  # the same model is not better than itself
    reported = load_params(root / "params.yaml", {"registry": {"decision_split": "dev"}, "eval": {"split": "dev"}})
    third = register(reported, layout, tracking_uri=uri)  # deciding on the split it reports: said on the version
    tags = MlflowClient(tracking_uri=uri).get_model_version(reported.registry.model_name, str(third["version"])).tags
    assert tags["decided_on_reported_split"] == "true"


def test_dev_scores_and_em_rounds_are_logged_as_curves_at_their_steps(tmp_path, mlflow_uri):
    """The train report's dev_scores (train.dev_every) land in the MLflow store as train.dev at
    each scored training step; HCE's rounds at their round numbers, with the re-clustering flags."""
    layout = Layout(tmp_path / "ws")
    layout.train_report.mkdir(parents=True)
    scores = [{"step": 0, "dev": 0.5}, {"step": 60, "dev": 0.625}, {"step": 120, "dev": 0.25}]
    (layout.train_report / "metrics.json").write_text(json.dumps({"dev_scores": scores}))
    client, previous = MlflowClient(mlflow_uri), mlflow.get_tracking_uri()
    experiment = client.create_experiment("curves")  # not the process's active one, which another test may have set
    mlflow.set_tracking_uri(mlflow_uri)
    try:
        with mlflow.start_run(experiment_id=experiment) as run:
            log_training_curves(layout)
        history = client.get_metric_history(run.info.run_id, "train.dev")
        assert sorted((m.step, m.value) for m in history) == [(0, 0.5), (60, 0.625), (120, 0.25)]

        rounds = [{"round": 0, "dev": 0.5, "reclustered": True}, {"round": 1, "dev": 0.75, "reclustered": True},
                  {"round": 2, "dev": 0.5, "reclustered": False}]
        (layout.train_report / "metrics.json").write_text(json.dumps({"rounds": rounds}))
        with mlflow.start_run(experiment_id=experiment) as run:
            log_training_curves(layout)
    finally:
        mlflow.set_tracking_uri(previous)
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train.dev")) == [
        (0, 0.5), (1, 0.75), (2, 0.5)]
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train.reclustered")) == [
        (0, 1.0), (1, 1.0), (2, 0.0)]
    assert client.get_run(run.info.run_id).data.tags["train.reclusterings"] == "1"
