"""An update on ``index.backend: milvus`` killed (-9) at each step of its commit:

* before its commit row (the collection written, the delta logged to the run): the champion serves exactly what it
  served before (the killed update's rows are in the collection, under a write-set no version
  lists); the batch applied again is served once; ``fresh-registry gc`` deletes the killed update's
  rows and nothing a registered version lists;
* after its commit row: before its model is logged, before its version is registered, or before the
  champion alias moved to it. A server following the champion (a second process from the killed
  writer) serves the batch whole at once; ``gc`` keeps its rows; the next writer logs its model (from
  the deployment's copy of the committed version), registers it or moves the alias, instead of
  applying it again, and the server then names the registered version without reloading anything.
  ``fresh-registry search`` answers from the commit as the server does (``--model`` a version: as registered).

``gc`` trims a commit's row only once the champion holds it; a server that finds the commit it
serves trimmed keeps serving it, and a rollback does not bring it back."""

import json
import subprocess
import sys

import mlflow
import pytest
import yaml
from mlflow import MlflowClient
from pymilvus import MilvusClient

from model_code.config import load_params
from model_code.freshness.deployment import apply_batch, rollback
from model_code.io import file_sha256
from model_code.layout import Layout
from model_code.stores.milvus_commits import CommitLog
from orchestration.maintenance import milvus_gc
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
from tests.conftest import REPOSITORY
from tests.helpers.batches import write_batch
from tests.helpers.deployment import IN_DOMAIN, MODEL, deploy
from tracking import cli
from tracking.collections import collect_garbage
from tracking.deployment import MlflowRegistry
from tracking.following import MODEL_ENV, Follower, ServedVersion, logged_here
from tracking.pyfunc import load_artifacts

KILLED_AT = """
import importlib, os, signal, sys
from pathlib import Path
import tracking.deployment
from model_code.config import load_params
from model_code.freshness.deployment import apply_batch
from model_code.layout import Layout
from tracking.deployment import MlflowRegistry

def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

owner, name = sys.argv[4].rsplit(".", 1)  # module.<name>, <class>.<method>, or <importable module>.<name>
setattr(tracking.deployment if owner == "module" else getattr(tracking.deployment, owner, None)
        or importlib.import_module(owner), name, killed)
root, uri, batch = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
params, layout = load_params(root / "params.yaml"), Layout(root)
apply_batch(MlflowRegistry(params, layout, uri), params, layout, batch)
"""


def kill(root, uri: str, batch, at: str) -> None:
    """Apply ``batch`` in a child process killed (-9) on calling ``at`` (``module.<name>`` or
    ``<class>.<method>`` of a class tracking.deployment uses)."""
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, str(root), uri, str(batch), at], cwd=REPOSITORY,
                            capture_output=True, text=True, check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]


def deployed_on(milvus_server: str, prefix: str, tmp_path, tiny_model_dir):
    """A dense champion (v1) on the Milvus server: (root, tracking URI, params, layout, registry)."""
    index = {"backend": "milvus", "milvus": {"uri": milvus_server, "collection_prefix": prefix}}
    root, uri, _ = deploy(tmp_path, tiny_model_dir, "dense", index=index)
    params, layout = load_params(root / "params.yaml"), Layout(root)
    return root, uri, params, layout, MlflowRegistry(params, layout, uri)


def following_v1(registry: MlflowRegistry) -> Follower:
    """A server's follower of the champion, serving v1 (stepped by hand: ``follow_once``)."""
    return Follower(MODEL, "champion", ServedVersion.loaded(load_artifacts, f"models:/{MODEL}/1", "1",
                                                            registry.version("1").tags), load_artifacts, 1.0)


def served(uri: str) -> set[str]:
    mlflow.set_tracking_uri(uri)
    return set(mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").unwrap_python_model().retriever.live_ids())


def test_a_kill_between_the_collection_write_and_the_registry_write_serves_nothing_half_applied(
        tmp_path, tiny_model_dir, milvus_server):
    root, uri, params, layout, registry = deployed_on(milvus_server, "killed_update", tmp_path, tiny_model_dir)
    before = served(uri)
    batch = write_batch(tmp_path / "b1.jsonl", IN_DOMAIN)
    new = {d["_id"] for d in IN_DOMAIN}

    kill(root, uri, batch, "CommitLog.commit")  # the rows written, the delta logged; nothing committed
    collection = registry.champion().tags["index_collection"]
    milvus = MilvusClient(uri=milvus_server)
    written = milvus.query(collection, filter=f"doc_id in {json.dumps(sorted(new))}", output_fields=["born"])
    assert len(written) == len(new)  # the killed update did write its rows
    assert registry.champion().version == "1" and served(uri) == before  # and nothing of it is served

    result = apply_batch(registry, params, layout, batch)  # the batch again, as the retried run does
    assert result["registered_version"] == 2 and served(uri) == before | new
    rows = lambda: milvus.query(collection, filter=f"doc_id in {json.dumps(sorted(new))}", output_fields=["born"])
    assert len(rows()) == 2 * len(new)  # the killed write-set's rows, invisible, and the served ones

    swept = collect_garbage(params, layout, grace_s=0, apply=True)
    assert swept["by_uri"][milvus_server]["rows_deleted"] == len(new)
    assert len(rows()) == len(new) and served(uri) == before | new


# the kills after the commit take the same recovery (the commit row is served; the next writer registers it): the fast
# tier kills at the registration and between logging the model and setting its signature (MLflow marks it READY
# first), the slow tier before logging the retriever and at the alias
@pytest.mark.parametrize("at", [pytest.param("module.log_retriever", marks=pytest.mark.slow), "mlflow.models.set_signature",
                                "MlflowRegistry._register", pytest.param("MlflowRegistry._make_champion",
                                                                         marks=pytest.mark.slow)])
def test_a_kill_after_the_commit_serves_the_batch_whole_and_the_next_writer_only_registers_it(
        tmp_path, tiny_model_dir, milvus_server, at, monkeypatch, capsys):
    root, uri, params, layout, registry = deployed_on(milvus_server, "committed_update", tmp_path, tiny_model_dir)
    before, new, follower = served(uri), {d["_id"] for d in IN_DOMAIN}, following_v1(registry)
    assert not follower.follow_once() and follower.served.version == "1"
    v1_limits = follower.served.limits
    settings = yaml.safe_load((root / "params.yaml").read_text())  # the update is logged with other request limits
    (root / "params.yaml").write_text(yaml.safe_dump({**settings, "serve": {**settings.get("serve", {}), "max_k": 7}}))
    params = load_params(root / "params.yaml")
    registry = MlflowRegistry(params, layout, uri)

    batch = write_batch(tmp_path / "b1.jsonl", IN_DOMAIN)
    kill(root, uri, batch, at)
    assert registry.champion().version == "1"  # the registry's champion has not moved
    assert follower.follow_once()  # but the commit is served, whole, by the following server
    assert follower.served.version == "1+v0001" and set(follower.served.retriever.live_ids()) == before | new
    assert follower.served.limits == v1_limits != params.serve  # a commit row carries none: v1's until it registers
    if at == "MlflowRegistry._register":  # the command line answers as the following server does
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv(MODEL_ENV, MODEL)  # which `search` sets: undone after the test
        everything = ["search", "comet nebula telescope", "-k", str(len(before | new))]
        assert cli.main(["--params", str(root / "params.yaml"), "--root", str(root), *everything]) == 0
        answer = capsys.readouterr().out
        assert "version 1+v0001" in answer and all(doc_id in answer for doc_id in new)
        assert cli.main(["--params", str(root / "params.yaml"), "--root", str(root), *everything,
                         "--model", f"models:/{MODEL}/1"]) == 0  # a registered version, as registered
        assert not any(doc_id in capsys.readouterr().out for doc_id in new)
    collection = registry.champion().tags["index_collection"]
    commit = CommitLog.of_tags(registry.champion().tags, logged_here).read().commits["v0001"]
    rows = lambda: MilvusClient(uri=milvus_server).query(  # the rows it wrote (tests' copies share the collection)
        collection, filter=f"born in {commit.write_sets[collection]}", output_fields=["doc_id"])
    assert sorted(row["doc_id"] for row in rows()) == sorted(new)
    collect_garbage(params, layout, grace_s=0, apply=True)
    assert len(rows()) == len(new)  # served: kept, though no registered version lists it yet
    assert set(follower.served.retriever.live_ids()) == before | new

    retriever = follower.served.retriever
    result = apply_batch(registry, params, layout, batch)  # the batch again, as the retried run does
    assert result["status"] == "skipped" and "already served by champion v2" in result["reason"]
    champion = registry.champion()
    assert champion.version == "2" and champion.retriever_version == "v0001"
    signature = mlflow.models.get_model_info(f"models:/{MODEL}/2").signature  # the request params a server reads
    assert signature.params is not None and {"k", "return"} <= {p.name for p in signature.params.params}
    assert champion.tags["batch_sha256"] == file_sha256(batch) and champion.tags["parent_version"] == "1"
    assert len(registry.client.search_model_versions(f"name = '{MODEL}'")) == 2  # registered once
    assert served(uri) == before | new
    assert len(rows()) == len(new)  # written once
    assert follower.follow_once() and follower.served.version == "2"
    assert follower.served.retriever is retriever  # named by its registered version: nothing reloaded
    assert follower.served.limits == params.serve  # with the limits v2 was logged with


def test_a_rollback_revokes_the_commits_the_earlier_version_does_not_hold(tmp_path, tiny_model_dir, milvus_server):
    _, uri, params, layout, registry = deployed_on(milvus_server, "revoked_update", tmp_path, tiny_model_dir)
    before, new, follower = served(uri), {d["_id"] for d in IN_DOMAIN}, following_v1(registry)
    apply_batch(registry, params, layout, write_batch(tmp_path / "b1.jsonl", IN_DOMAIN))
    assert follower.follow_once() and set(follower.served.retriever.live_ids()) == before | new

    rollback(registry, layout)
    assert follower.follow_once() and follower.served.version == "1"
    assert set(follower.served.retriever.live_ids()) == before
    assert not follower.follow_once()  # the revoked commit extends v1 no more
    fresh = following_v1(registry)
    assert not fresh.follow_once() and fresh.served.version == "1"  # nor a server started afterwards

    other = [{**d, "_id": d["_id"] + "-again"} for d in IN_DOMAIN]
    apply_batch(registry, params, layout, write_batch(tmp_path / "b2.jsonl", other))
    assert follower.follow_once() and follower.served.version == "3"
    assert set(follower.served.retriever.live_ids()) == before | {d["_id"] for d in other}


def test_gc_trims_a_commit_once_the_champion_holds_it_and_no_server_goes_back_for_it(
        tmp_path, tiny_model_dir, milvus_server, monkeypatch):
    root, uri, params, layout, registry = deployed_on(milvus_server, "trimmed_update", tmp_path, tiny_model_dir)
    settings = yaml.safe_load((root / "params.yaml").read_text())
    settings["freshness"]["full_copy_every"] = 2  # v0001 a delta, v0002 a whole copy (no commit row), v0003 a delta
    (root / "params.yaml").write_text(yaml.safe_dump(settings))
    params = load_params(root / "params.yaml")
    before, batches = served(uri), [[{**d, "_id": f"{d['_id']}-{n}"} for d in IN_DOMAIN] for n in range(3)]
    new = [{d["_id"] for d in batch} for batch in batches]
    follower, behind = following_v1(registry), following_v1(registry)  # behind: polls again only at the end
    files = [write_batch(tmp_path / f"b{n}.jsonl", batch) for n, batch in enumerate(batches)]
    kill(root, uri, files[0], "MlflowRegistry._make_champion")  # registered as v2; the champion is still v1
    assert follower.follow_once() and behind.follow_once() and follower.served.version == "1+v0001"
    collection = registry.champion().tags["index_collection"]
    trimmed = lambda grace_s: collect_garbage(params, layout, grace_s, apply=True)["commit_rows_trimmed"][collection]
    log = lambda: CommitLog.of_tags(registry.champion().tags, logged_here).read()
    assert trimmed(0) == 0 and "v0001" in log().commits  # servers of v1 serve it after v1: kept

    for file in files:  # the next writer moves the champion to v2, then v3 (a whole copy) and v4
        apply_batch(registry, params, layout, file)
    assert registry.champion().version == "4" and sorted(log().commits) == ["v0001", "v0003"]
    assert trimmed(3600) == 0  # registered less than the grace period ago
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # (set by mlflow.set_tracking_uri) the job finds the store by its resource
    gc_run = milvus_gc.execute_in_process(  # the daily schedule's job: the same gc, in Dagster
        run_config={"ops": {"collect_milvus_garbage": {"config": {"grace_hours": 0}}}},
        resources={"params": ParamsResource(path=str(root / "params.yaml")), "workspace": WorkspaceResource(root=str(root)),
                   "mlflow_store": MlflowResource(tracking_uri=uri)})
    assert gc_run.output_for_node("collect_milvus_garbage")["commit_rows_trimmed"] == {collection: 2}  # past the copy
    assert log().commits == {}
    assert served(uri) == before | new[0] | new[1] | new[2]  # their rows stay: v2 and v4 list them

    alias_reads = []  # a server that read the alias before it moved (v1), and the log after the trim: the commit it
    def stale_first(client, name, alias):  # serves is gone, but the alias, read again, names a version holding it
        alias_reads.append(alias)
        return MlflowClient().get_model_version(name, "1") if len(alias_reads) == 1 \
            else MlflowClient().get_model_version_by_alias(name, alias)
    monkeypatch.setattr("tracking.following.MlflowClient", type("StaleFirst", (MlflowClient,),
                                                                {"get_model_version_by_alias": stale_first}))
    retriever = follower.served.retriever
    assert not follower.follow_once() and follower.served.version == "1+v0001" and len(alias_reads) == 2
    assert follower.served.retriever is retriever
    monkeypatch.undo()
    assert follower.follow_once() and follower.served.version == "4"

    rollback(registry, layout, to_version="1")  # revokes nothing: the log no longer has the commits
    for server in (follower, behind):  # behind still serves 1+v0001 and reads the alias v1 it is registered at
        assert server.follow_once() and server.served.version == "1"
        assert set(server.served.retriever.live_ids()) == before
    assert not following_v1(registry).follow_once()

    rows = lambda: MilvusClient(uri=milvus_server).query(collection, filter=f"doc_id in {json.dumps(sorted(new[1]))}",
                                                          output_fields=["born"])
    assert len(rows()) == len(new[1])
    registry.client.delete_model_version(MODEL, "3")  # the whole copy v4 applies to, deleted by hand
    collect_garbage(params, layout, grace_s=0, apply=True)
    assert len(rows()) == len(new[1])  # kept: v4 may be made champion again, and it serves them
