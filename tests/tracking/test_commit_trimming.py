"""Which commit rows ``fresh-registry gc`` trims (``tracking.collections.settled_commits``), on a real
MLflow registry (versions made by hand, with the tags updates give them) and a commit log on a
Milvus Lite file: registered more than the grace period ago, not revoked, and held by what the
alias names (through whole copies, which have no commit row), or any when the alias names
another lineage or nothing."""

from types import SimpleNamespace

import pytest
from mlflow import MlflowClient
from pymilvus import MilvusClient

from model_code.config import IndexParams, load_params
from model_code.layout import Layout
from model_code.stores.milvus_commits import Commit, CommitLog
from model_code.stores.milvus_store import MilvusStore
from tests.conftest import REPOSITORY
from tests.helpers.vectors import unit_rows
from tracking.collections import collect_garbage, settled_commits
from tracking.deployment import MlflowRegistry

MODEL = "trimmed"


@pytest.fixture
def lineage(tmp_path, mlflow_uri):
    """A registry holding v1 (the lineage's full training), v2 (delta v0001, committed), v3 (whole
    copy v0002, not committed), v4 (delta v0003, committed); v0004 committed, not registered; v0005
    committed, registered as v5 and revoked; the log's commits; the champion is v4."""
    store = MilvusStore.build(unit_rows(3, 8), ["a", "b", "c"],
                              IndexParams(backend="milvus", milvus={"uri": str(tmp_path / "milvus.db")}))
    client, collection = MlflowClient(mlflow_uri), store.connection.collection
    experiment = client.create_experiment("trim")
    client.create_registered_model(MODEL)
    log = CommitLog(store.connection, lambda commit: True)
    parent = "base"
    for number, retriever_version in enumerate(["base", "v0001", "v0002", "v0003", "v0004", "v0005"], start=1):
        run = client.create_run(experiment).info.run_id
        tags = {"index_collection": collection, "retriever_version": retriever_version}
        if number > 1:
            tags |= {"update": "incremental", "parent_version": str(number - 1)}
        if retriever_version != "v0004":
            client.create_model_version(MODEL, f"runs:/{run}/retriever", run_id=run, tags=tags)
        if retriever_version not in ("base", "v0002"):  # a whole copy is not committed
            log.commit(Commit(version=retriever_version, delta_of=parent, delta_uri=f"runs:/{run}/delta", run_id=run,
                              alias="champion"))
        parent = retriever_version
    log.read().revoke(log.commits["v0005"], "rolled back")
    client.set_registered_model_alias(MODEL, "champion", "4")
    registry = SimpleNamespace(client=client, name=MODEL)  # what settled_commits reads of an MlflowRegistry
    registry.alias_version = lambda alias: MlflowRegistry.alias_version(registry, alias)
    return registry, log.read(), collection


def trimmed(lineage, grace_s: float = 0) -> list[str]:
    registry, log, collection = lineage
    versions = registry.client.search_model_versions(f"name = '{MODEL}'")
    return sorted(c.version for c in settled_commits(registry, log, collection, versions, grace_s))


def test_what_the_alias_holds_is_trimmed_past_a_whole_copy_or_all_when_it_names_another_lineage(lineage):
    registry = lineage[0]
    assert trimmed(lineage) == ["v0001", "v0003"]  # v0004 unregistered, v0005 revoked
    assert trimmed(lineage, grace_s=3600) == []  # registered less than an hour ago

    registry.client.set_registered_model_alias(MODEL, "champion", "2")
    assert trimmed(lineage) == ["v0001"]  # v0003 extends v2 for every server following it

    other = registry.client.create_run(registry.client.create_experiment("retrain")).info.run_id
    registry.client.create_model_version(MODEL, f"runs:/{other}/retriever", run_id=other,
                                         tags={"index_collection": "another_lineage", "retriever_version": "base"})
    registry.client.set_registered_model_alias(MODEL, "champion", "6")  # a promoted retrain
    assert trimmed(lineage) == ["v0001", "v0003"]  # a rollback into this lineage revokes what it does not hold
    registry.client.delete_registered_model_alias(MODEL, "champion")
    assert trimmed(lineage) == ["v0001", "v0003"]


def test_gc_against_a_store_with_no_registered_version_collects_nothing(tmp_path, mlflow_uri):
    """The wrong MLflow store (an unset MLFLOW_TRACKING_URI) would make every collection garbage."""
    uri = str(tmp_path / "milvus.db")
    store = MilvusStore.build(unit_rows(3, 8), ["a", "b", "c"], IndexParams(backend="milvus", milvus={"uri": uri}))
    collection = store.connection.collection
    store.connection.client.close()
    params = load_params(REPOSITORY / "params.yaml", {"index": {"backend": "milvus", "milvus": {"uri": uri}}})
    with pytest.raises(LookupError, match="has no versions of 'fresh-retriever': nothing collected"):
        collect_garbage(params, Layout(tmp_path / "workspace"), 0, apply=True, tracking_uri=mlflow_uri)
    assert MilvusClient(uri).has_collection(collection)
