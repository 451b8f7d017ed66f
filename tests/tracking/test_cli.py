"""``fresh-registry``: what the tracking store refuses is an error naming it, exit status 2, never
a traceback (``rollback --to`` a version that does not exist raised MLflow's exception whole)."""

import yaml
from mlflow import MlflowClient

from tracking.cli import main


def test_a_rollback_to_a_version_that_does_not_exist_is_an_error_naming_it(tmp_path, mlflow_uri, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"registry": {"experiment": "test", "model_name": "test-retriever"}}))
    client = MlflowClient(tracking_uri=mlflow_uri)
    client.create_registered_model("test-retriever")
    client.create_model_version("test-retriever", source="file:///nowhere")
    client.set_registered_model_alias("test-retriever", "champion", "1")
    assert main(["--params", str(params), "--root", str(tmp_path), "rollback", "--to", "999"]) == 2
    err = capsys.readouterr().err
    assert "fresh-registry rollback: error: registered model 'test-retriever' has no version 999" in err
    assert "Traceback" not in err
