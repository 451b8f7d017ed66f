"""``tracking/deployment.py``'s reads of the registry: "no champion" only where the store says the
model or its alias does not exist (any other failure is raised), and every registered version,
however many pages the search takes."""

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

from model_code.config import Params
from model_code.freshness.deployment import NoChampionError
from model_code.layout import Layout
from tracking.deployment import MlflowRegistry


@pytest.fixture
def registry(tmp_path, mlflow_uri) -> MlflowRegistry:
    params = Params.model_validate({"registry": {"experiment": "test", "model_name": "test-retriever"}})
    return MlflowRegistry(params, Layout(tmp_path / "ws"), mlflow_uri)


def test_only_a_missing_model_or_alias_is_no_champion(registry, monkeypatch):
    """Before: any MlflowException (a locked SQLite store) read as "no champion yet", so a retrain was
    made champion whatever its score and an exclusion skipped its check that nothing served the batch."""
    with pytest.raises(NoChampionError):  # no such model
        registry.champion()
    client = MlflowClient()
    client.create_registered_model("test-retriever")
    with pytest.raises(NoChampionError):  # the model, no such alias
        registry.champion()
    version = client.create_model_version("test-retriever", source="file:///nowhere")
    client.set_registered_model_alias("test-retriever", "champion", version.version)
    assert registry.champion().version == "1"

    def locked(*args, **kwargs):
        raise MlflowException("(sqlite3.OperationalError) database is locked", error_code=TEMPORARILY_UNAVAILABLE)

    monkeypatch.setattr(registry.client, "get_model_version_by_alias", locked)
    with pytest.raises(MlflowException, match="database is locked"):
        registry.champion()


def test_every_version_is_listed_across_pages(registry):
    """Before: ``gc`` read one page of versions (MLflow's 10,000 at most) and took the collections of
    the versions past it for garbage."""
    client = MlflowClient()
    client.create_registered_model("test-retriever")
    for _ in range(5):
        client.create_model_version("test-retriever", source="file:///nowhere")
    assert sorted(int(v.version) for v in registry.all_versions(page_size=2)) == [1, 2, 3, 4, 5]
