"""Fault suite of the deployment path (issue: the freshness loop applies every batch exactly once):
races between readers and writers of one deployment, concurrent first checkouts, vectors made by
another champion's encoder. Each test reproduces a failure seen before the fix and checks that
the registry, the retriever versions and what the champion serves agree."""

import json
import shutil
import threading
import time

import mlflow
import mlflow.pyfunc
import numpy as np
import pytest
import yaml
from mlflow import MlflowClient

from model_code.config import load_params
from model_code.freshness.deployment import apply_batch, checkout, installed
from model_code.layout import Layout
from model_code.versions import apply
from model_code.versions.chain import RetrieverVersions
from tests.conftest import REPOSITORY
from tests.helpers.batch_processing import process_batch
from tests.helpers.batches import write_batch
from tests.helpers.deployment import MODEL, deploy
from tracking.deployment import MlflowRegistry


def one_document_batch(tmp_path, number: int):
    doc = {"_id": f"new-{number}", "title": f"volcano {number}", "text": f"lava magma eruption crater number {number}"}
    return write_batch(tmp_path / f"b{number}.jsonl", [doc]), doc["_id"]


def served_documents(uri: str, version: str, layout: Layout, params) -> set[str]:
    """What registered ``version`` serves, read back through its tags and the deployment on disk."""
    tags = MlflowClient(tracking_uri=uri).get_model_version(MODEL, version).tags
    deployment = Layout(layout.deployments / f"v{tags.get('lineage_root', version)}")
    return set(RetrieverVersions(deployment).load_version(tags.get("retriever_version", "base")).live_ids())


def test_a_pointer_moved_during_an_update_changes_no_registered_version(deployed, tmp_path, monkeypatch):
    """Before: registration read CURRENT, and an unlocked checkout (the drift report's) could reset
    it between the writer's checkout and its update: registered versions were one batch behind or
    branched from a stale version and lost a batch. Here every update finds CURRENT moved back to
    the lineage's base just before it starts."""
    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    upsert_documents = apply.upsert_documents

    def after_a_stray_checkout(deployment, *args, **kwargs):
        RetrieverVersions(deployment).checkout("base")  # what an unlocked reader's checkout could do
        return upsert_documents(deployment, *args, **kwargs)

    monkeypatch.setattr(apply, "upsert_documents", after_a_stray_checkout)
    added = [apply_batch(registry, params, layout, one_document_batch(tmp_path, n)[0]) for n in range(3)]
    for number, result in enumerate(added):
        expected = {f"new-{k}" for k in range(number + 1)}  # its own batch and every earlier one
        assert expected <= served_documents(uri, str(result["registered_version"]), layout, params), number
    champion = registry.champion()
    assert champion.version == str(added[-1]["registered_version"])
    deployment = installed(registry, layout, champion)
    chain = RetrieverVersions(deployment).manifests(champion.retriever_version)
    assert [m["doc_ids"] for m in chain] == [[f"new-{n}"] for n in range(3)]  # each batch once, in order


def test_concurrent_first_checkouts_install_once_and_keep_every_version(deployed, tmp_path, monkeypatch):
    """Before: a drift report and an update checking out a champion not yet on disk both
    downloaded it; the second download swapped the directory and the update's versions were gone."""
    params, layout, uri = deployed
    shutil.rmtree(layout.deployments, ignore_errors=True)
    download = MlflowRegistry.download

    def slow_download(self, version, destination):
        # the readers' downloads end after the update has written its version: a second install
        # that replaced the directory would take that version with it
        time.sleep(0.2 if threading.current_thread().name == "writer" else 4.0)
        return download(self, version, destination)

    monkeypatch.setattr(MlflowRegistry, "download", slow_download)
    batch, doc_id = one_document_batch(tmp_path, 0)
    results, errors = [], []

    def run(work):
        try:
            results.append(work())
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    registry = MlflowRegistry(params, layout, uri)
    threads = [threading.Thread(target=run, args=(lambda: apply_batch(registry, params, layout, batch),), name="writer")]
    threads += [threading.Thread(target=run, args=(lambda: installed(registry, layout, registry.champion()),))
                for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    champion = registry.champion()
    assert champion.retriever_version == "v0001"
    assert doc_id in served_documents(uri, champion.version, layout, params)
    deployment, _ = checkout(registry, layout)  # the next checkout finds the version the update wrote
    assert RetrieverVersions(deployment).current_name == "v0001"


def test_vectors_made_by_another_champions_encoder_are_encoded_again(deployed, tmp_path):
    """Before: an update reused the drift report's vectors whatever encoder made them (a report
    against v1, a retrain promoted, then the queued update: old-encoder vectors in the new champion)."""
    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    rng = np.random.default_rng(0)

    def stored_vector(result, doc_id):
        deployment = installed(registry, layout, registry.champion())
        index = RetrieverVersions(deployment).load_version(result["retriever_version"]).index
        return index.vectors([doc_id])[0]

    batch, doc_id = one_document_batch(tmp_path, 0)
    stale = rng.normal(size=384).astype(np.float32)
    stale /= np.linalg.norm(stale)
    result = apply_batch(registry, params, layout, batch, ({doc_id: stale}, "lineage-v999"))
    deployment = installed(registry, layout, registry.champion())
    text = json.loads(batch.read_text())
    expected = RetrieverVersions(deployment).load_version("base").encoder.embed_texts([f"{text['title']} {text['text']}"])[0]
    assert float(stored_vector(result, doc_id) @ expected) > 0.999  # encoded again by the champion's encoder

    batch, doc_id = one_document_batch(tmp_path, 1)
    fresh = rng.normal(size=384).astype(np.float32)
    fresh /= np.linalg.norm(fresh)
    result = apply_batch(registry, params, layout, batch, ({doc_id: fresh}, registry.champion().encoder_fingerprint))
    assert np.allclose(stored_vector(result, doc_id), fresh)  # the champion's own vectors are reused


KILL_WHILE_ACCEPTING = """
import os, signal, sys
from pathlib import Path
import model_code.freshness.inbox as inbox_module

root, point = Path(sys.argv[1]), sys.argv[2]
real_replace, real_append = os.replace, inbox_module.Inbox._append

def replace(source, target):  # kill -9 the moment the copy would enter accepted/
    if Path(target).parent.name == "accepted":
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(source, target)

def append(self, file, records):  # kill -9 right after the ledger line, the dropped file not removed
    real_append(self, file, records)
    os.kill(os.getpid(), signal.SIGKILL)

if point == "move":
    inbox_module.os.replace = replace
else:
    inbox_module.Inbox._append = append
inbox_module.Inbox(root, settle_seconds=0).receive()
"""


@pytest.mark.parametrize("point", ["move", "ledger"])
def test_a_kill_while_accepting_a_batch_loses_nothing_and_accepts_it_once(tmp_path, point):
    """kill -9 while the inbox accepts a file: the file is claimed (renamed) first; before the
    ledger line (the copy entering accepted/) the next receive accepts the claimed file whole;
    after it, the next receive finds the content recorded and sorts the file into duplicates/. Either way one
    ledger line, one accepted copy, nothing left waiting, no stray copy."""
    import subprocess
    import sys

    from model_code.freshness.inbox import Inbox

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    inbox.root.mkdir()
    write_batch(inbox.root / "b1.jsonl", [{"_id": "d1", "title": "t", "text": "lava magma eruption"}])
    killed = subprocess.run([sys.executable, "-c", KILL_WHILE_ACCEPTING, str(inbox.root), point],
                            cwd=REPOSITORY, check=False)
    assert killed.returncode == -9
    assert len(inbox.batches()) == (0 if point == "move" else 1) and (inbox.root / ".claimed.b1.jsonl").exists()
    outcome = inbox.receive()  # the next sensor tick
    if point == "move":
        assert [b.name for b in outcome["accepted"]] == ["b1.jsonl"]
    else:
        assert outcome == {"accepted": [], "duplicates": ["b1.jsonl"], "quarantined": []}
    [batch] = inbox.batches()
    assert batch.path.read_bytes() == (inbox.duplicates_dir / "b1.jsonl" if point == "ledger" else batch.path).read_bytes()
    assert not list(inbox.root.glob("*b1.jsonl")) and not list(inbox.accepted_dir.glob(".*"))
    assert inbox.receive() == {"accepted": [], "duplicates": [], "quarantined": []}  # nothing left, nothing twice


def test_a_sensor_tick_that_died_after_adding_the_partition_requests_the_run_again(tmp_path):
    """Before: runs were requested only for batches without a partition, and the daemon adds
    partitions before it saves the run requests: a crash between the two dropped the batch."""
    import dagster as dg

    from assets.incoming import incoming_batch
    from orchestration.resources import ParamsResource, WorkspaceResource
    from orchestration.sensors import inbox_sensor

    root = tmp_path / "workspace"
    write_batch(root / "inbox" / "b1.jsonl", [{"_id": "d1", "title": "t", "text": "lava magma eruption"}])
    (root / "params.yaml").write_text("{}\n")  # the defaults: the inbox validates with params.data
    resources = {"workspace": WorkspaceResource(root=str(root)), "params": ParamsResource(path=str(root / "params.yaml"))}
    with dg.instance_for_test() as instance:
        time.sleep(1.1)  # the inbox lets a file settle for a second before taking it
        first = inbox_sensor(dg.build_sensor_context(instance=instance, resources=resources))
        [request] = first.run_requests
        for partitions in first.dynamic_partitions_requests:  # the partition is saved, the run is not
            instance.add_dynamic_partitions(partitions.partitions_def_name, list(partitions.partition_keys))
        again = inbox_sensor(dg.build_sensor_context(instance=instance, resources=resources))
        assert [(r.partition_key, r.run_key) for r in again.run_requests] == [(request.partition_key, request.run_key)]
        assert not again.dynamic_partitions_requests  # the partition is not added twice
        assert dg.materialize([incoming_batch], partition_key=request.partition_key, instance=instance,
                              resources=resources).success
        assert isinstance(inbox_sensor(dg.build_sensor_context(instance=instance, resources=resources)), dg.SkipReason)


def test_the_instance_retries_runs_whose_worker_died_and_watches_for_dead_runs(tmp_path):
    """Before: a killed run worker left the run failed and its batch never retried; after a host
    crash the run stayed STARTED for ever and the deployment's concurrency slot stayed taken."""
    import dagster as dg

    from assets._common import DEPLOYMENT_POOL
    from assets.incoming import INCOMING_ASSETS_RETRY, champion_update
    from assets.pipeline import PIPELINE_ASSETS

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPOSITORY / "orchestration" / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_runtime_seconds > 0
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
    assert champion_update.op.retry_policy == INCOMING_ASSETS_RETRY
    registration = next(a for a in PIPELINE_ASSETS if a.key.to_user_string() == "registered_model")
    assert champion_update.op.pool == registration.op.pool == DEPLOYMENT_POOL  # one deployment writer at a time


def test_a_registration_compares_with_the_champion_an_update_is_promoting(deployed, tmp_path, monkeypatch):
    """Before: a full registration read the champion and moved the alias without the lock an
    update holds, so an update promoted in between was overwritten or compared against stale."""
    import tracking.deployment
    import tracking.registry
    from tracking.registry import register

    params, layout, uri = deployed
    release, events = threading.Event(), []
    log_retriever = tracking.deployment.log_retriever
    champion_on_this_data = tracking.registry.champion_on_this_data

    def slow_update_logging(*args, **kwargs):  # the update holds the deployment lock meanwhile
        release.wait(timeout=60)
        return log_retriever(*args, **kwargs)

    def recorded_check(*args, **kwargs):
        events.append(("registration checks the champion", time.monotonic()))
        return champion_on_this_data(*args, **kwargs)

    monkeypatch.setattr(tracking.deployment, "log_retriever", slow_update_logging)
    monkeypatch.setattr(tracking.registry, "champion_on_this_data", recorded_check)
    results = {}
    update = threading.Thread(target=lambda: results.update(
        update=apply_batch(MlflowRegistry(params, layout, uri), params, layout, one_document_batch(tmp_path, 0)[0])))
    update.start()
    time.sleep(1.0)  # the update has checked out and holds the lock
    retrain = threading.Thread(target=lambda: results.update(retrain=register(params, layout, tracking_uri=uri)))
    retrain.start()
    time.sleep(8.0)  # long enough for the registration to reach its champion check if nothing held it back
    events.append(("update released", time.monotonic()))
    release.set()
    update.join()
    retrain.join()
    assert [name for name, _ in sorted(events, key=lambda e: e[1])] == [
        "update released", "registration checks the champion"]
    assert results["update"]["registered_version"] == 2
    assert str(results["retrain"]["previous_champion_version"]) == "2"  # compared with the promoted update


def test_a_version_carries_its_tags_from_the_moment_it_exists(deployed, tmp_path, monkeypatch):
    """Before: tags were set one by one after registration, so a kill between left an untagged
    version that no checkout could place in its lineage."""
    from mlflow import MlflowClient as Client

    params, layout, uri = deployed

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed after the version was created")

    monkeypatch.setattr(Client, "set_model_version_tag", killed)
    monkeypatch.setattr(Client, "set_registered_model_alias", killed)
    with pytest.raises(KeyboardInterrupt):
        apply_batch(MlflowRegistry(params, layout, uri), params, layout, one_document_batch(tmp_path, 0)[0])
    monkeypatch.undo()
    orphan = MlflowClient(tracking_uri=uri).get_model_version(MODEL, "2")
    assert {"lineage_root", "retriever_version", "parent_version", "batch_sha256"} <= set(orphan.tags)
    assert MlflowClient(tracking_uri=uri).get_model_version_by_alias(MODEL, "champion").version in ("1", 1)


def test_batches_waiting_to_be_applied_count_in_the_drift_volume(deployed, tmp_path):
    """Before: two reports at volume 0.042 each under a 0.05 limit both said "incremental" and the
    champion ended at 0.083 with no retrain."""
    import pandas as pd

    from model_code.data.ingested import load_ingested
    from model_code.freshness import report
    from model_code.freshness.drift import decide

    params, layout, uri = deployed
    params = load_params(layout.root / "params.yaml", {"freshness": {"thresholds": {"max_volume_ratio": 0.05}}})
    registry = MlflowRegistry(params, layout, uri)
    champion = registry.champion()
    deployment = installed(registry, layout, champion)
    data = load_ingested(layout.ingested)

    def measure(batch_id: str, numbers: list[int]) -> dict:
        documents = pd.DataFrame([{"doc_id": f"new-{n}", "title": "volcano", "text": f"lava magma crater {n}"}
                                  for n in numbers])
        return report.run(params, deployment, registry.champion().retriever_version, data, documents,
                          layout.drift_reports / batch_id, champion.encoder_fingerprint,
                          passage_text=champion.passage_text)["statistics"]

    first = measure("aaaa", [0, 1])
    assert first["volume_ratio"] == pytest.approx(2 / 48) and first["in_flight_documents"] == 0
    second = measure("bbbb", [2, 3])  # the first batch is decided but not applied yet
    assert second["in_flight_documents"] == 2 and second["volume_ratio"] == pytest.approx(4 / 48)
    decision, reasons = decide(second, params.freshness.thresholds, params.freshness.min_batch_documents)
    assert decision == "retrain" and any(r.startswith("volume_ratio") for r in reasons)


def test_a_batch_applied_before_its_own_report_is_measured_as_it_arrived(deployed):
    """Before: b2's run applied b1 first (ledger order) before b1's report ran; b1's report then
    found its documents indexed, measured nothing and decided none, so a drifted b1 never
    asked for a retrain."""
    from model_code.data.ingested import load_ingested
    from model_code.freshness import report
    from model_code.freshness.inbox import Inbox

    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    inbox = Inbox(layout.inbox, settle_seconds=0)
    write_batch(layout.inbox / "b1.jsonl", [{"_id": f"one-{n}", "text": f"lava magma crater {n}"} for n in range(3)])
    write_batch(layout.inbox / "b2.jsonl", [{"_id": "two", "text": "basalt flow"}])
    inbox.receive()
    b1, b2 = sorted(inbox.batches(), key=lambda b: b.name)
    assert apply_batch(registry, params, layout, b2.path)["caught_up"] == [b1.batch_id]  # b2's run came first
    champion = registry.champion()
    deployment = installed(registry, layout, champion)
    measured = report.run(params, deployment, champion.retriever_version, load_ingested(layout.ingested),
                          inbox.read(b1).documents, layout.drift_reports / b1.batch_id, champion.encoder_fingerprint,
                          passage_text=champion.passage_text, batch_sha256=b1.sha256)
    assert measured["documents"] == 3 and measured["statistics"]["batch_documents"] == 3
    versions = RetrieverVersions(deployment)
    before = measured["retriever_version"]
    assert b1.sha256 not in versions.applied_batches(before)  # the version b1 was applied to
    assert [m["parent"] for m in versions.manifests(champion.retriever_version)
            if m.get("batch_sha256") == b1.sha256] == [before]


def test_a_batch_that_arrives_before_any_champion_waits_and_is_applied_once_there_is_one(
        tmp_path, tiny_model_dir):
    """Before: its drift report failed (no champion to measure against) and it was never applied."""
    import dagster as dg

    from assets.incoming import batch_queries, champion_update, drift_report, incoming_batch
    from orchestration.sensors import drift_sensor, inbox_sensor
    from tests.helpers.deployment import IN_DOMAIN
    from tracking.registry import register

    root, uri, resources = deploy(tmp_path, tiny_model_dir, "dense", register_champion=False)
    write_batch(root / "inbox" / "b1.jsonl", IN_DOMAIN)
    process = [incoming_batch, batch_queries, drift_report, champion_update]  # the process_incoming_batch job
    with dg.instance_for_test() as instance:
        time.sleep(1.1)  # the inbox lets a file settle for a second
        received = inbox_sensor(dg.build_sensor_context(instance=instance, resources=resources))
        for partitions in received.dynamic_partitions_requests:
            instance.add_dynamic_partitions(partitions.partitions_def_name, list(partitions.partition_keys))
        [batch] = [r.partition_key for r in received.run_requests]
        first = dg.materialize(process, partition_key=batch, instance=instance, resources=resources)
        assert first.success and not first.asset_materializations_for_node("champion_update")  # left out
        report = json.loads((Layout(root).drift_reports / batch / "report.json").read_text())
        assert report["decision"] == "pending" and "no champion yet" in report["reasons"][0]
        waiting = drift_sensor(dg.build_sensor_context(instance=instance, resources=resources))
        assert not waiting.run_requests  # nothing to apply it to yet
        cursor = waiting.cursor

        register(load_params(root / "params.yaml"), Layout(root), tracking_uri=uri)  # the first champion
        recheck = drift_sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources))
        [request] = recheck.run_requests
        assert (request.job_name, request.partition_key, request.run_key) == (
            "process_incoming_batch", batch, f"recheck:{batch}:1")
        again = dg.materialize(process, partition_key=batch, instance=instance, resources=resources)
        assert again.success and again.asset_materializations_for_node("champion_update")  # measured and applied
        decided = drift_sensor(dg.build_sensor_context(instance=instance, cursor=recheck.cursor or cursor,
                                                       resources=resources))
        assert not decided.run_requests  # nothing left to apply or retrain
    champion = MlflowRegistry(load_params(root / "params.yaml"), Layout(root), uri).champion()
    assert champion.version == "2" and {"astronomy-new", "cooking-new"} <= served_documents(
        uri, champion.version, Layout(root), None)


def test_retrains_coalesce(tmp_path):
    """Before: every batch that asked for a retrain queued one of its own. (Such a batch is served
    at once by its own run's update: ``tests/end_to_end/test_freshness_loop.py``.)"""
    import dagster as dg

    from orchestration.definitions import defs
    from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
    from orchestration.sensors import drift_sensor

    resources = {"params": ParamsResource(path=str(tmp_path / "params.yaml")),
                 "workspace": WorkspaceResource(root=str(tmp_path)), "mlflow_store": MlflowResource()}

    def report(instance, batch: str, decision: str) -> None:
        instance.add_dynamic_partitions("incoming_batches", [batch])
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key="drift_report", partition=batch, metadata={"decision": decision}))

    def tick(instance, cursor=None):
        return drift_sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources))

    with dg.instance_for_test() as instance:
        report(instance, "b1", "retrain")
        report(instance, "b2", "retrain")
        first = tick(instance)
        assert [(r.job_name, r.tags["fresh/batch"]) for r in first.run_requests] == [("full_retrain", "b1")]
        job, retrain_config = defs.resolve_job_def("full_retrain"), first.run_requests[0].run_config
        queued = instance.create_run_for_job(job, run_config=retrain_config, tags={"fresh/batch": "b2"})
        report(instance, "b3", "retrain")
        second = tick(instance, first.cursor)
        assert not second.run_requests and "a retrain is already queued" in second.skip_reason.skip_message
        instance.delete_run(queued.run_id)  # a retrain already running may have ingested before b4 arrived
        instance.create_run_for_job(job, run_config=retrain_config, status=dg.DagsterRunStatus.STARTED)
        report(instance, "b4", "retrain")
        third = tick(instance, second.cursor)
        assert [(r.job_name, r.tags["fresh/batch"]) for r in third.run_requests] == [("full_retrain", "b4")]
        # queued, but ingesting nothing new: a retry resumes after its ingest, and a hand-launched retrain without
        # data.include_incoming reads no batch. Before, either made the sensor drop b5's retrain
        instance.create_run_for_job(job, run_config=retrain_config, tags={"dagster/parent_run_id": "an-earlier-run"})
        instance.create_run_for_job(job)
        report(instance, "b5", "retrain")
        fourth = tick(instance, third.cursor)
        assert [(r.job_name, r.tags["fresh/batch"]) for r in fourth.run_requests] == [("full_retrain", "b5")]


def test_a_pending_batch_is_rechecked_by_one_run_at_a_time_and_an_excluded_one_not_at_all(tmp_path, mlflow_uri):
    """Batches that arrived before the first champion wait (pending) for a recheck. Before: each new
    champion made a new run key for every pending batch, and the first recheck registers one, so N
    pending batches made N² runs; an excluded batch was rechecked too."""
    import dagster as dg

    from model_code.freshness import report
    from model_code.freshness.inbox import Inbox
    from orchestration.definitions import defs
    from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
    from orchestration.sensors import drift_sensor

    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"registry": {"experiment": "test",
                                                                       "model_name": "test-retriever"}}))
    resources = {"params": ParamsResource(path=str(tmp_path / "params.yaml")),
                 "workspace": WorkspaceResource(root=str(tmp_path)), "mlflow_store": MlflowResource(tracking_uri=mlflow_uri)}
    layout, inbox = Layout(tmp_path), Inbox(Layout(tmp_path).inbox, settle_seconds=0)
    for number in (1, 2, 3):
        write_batch(layout.inbox / f"b{number}.jsonl", [{"_id": f"new-{number}", "title": "", "text": "lava flow"}])
    inbox.receive()
    b1, b2, b3 = [b.batch_id for b in sorted(inbox.batches(), key=lambda b: b.name)]
    for batch in (b1, b2, b3):
        report.pending(layout.drift_reports / batch, "no champion yet")
    inbox.revert([inbox.batch(b3).sha256], "excluded", "test: taken out")
    client = MlflowClient(tracking_uri=mlflow_uri)
    client.create_registered_model("test-retriever")
    for _ in (1, 2):
        client.create_model_version("test-retriever", source="file:///nowhere")
    client.set_registered_model_alias("test-retriever", "champion", "1")

    def tick(instance):
        return drift_sensor(dg.build_sensor_context(instance=instance, resources=resources))

    with dg.instance_for_test() as instance:
        assert [(r.partition_key, r.run_key) for r in tick(instance).run_requests] == [
            (b1, f"recheck:{b1}:1"), (b2, f"recheck:{b2}:1")]
        instance.create_run_for_job(defs.resolve_job_def("process_incoming_batch"), tags={"dagster/partition": b1})
        client.set_registered_model_alias("test-retriever", "champion", "2")  # as b1's own recheck would register
        assert [(r.partition_key, r.run_key) for r in tick(instance).run_requests] == [(b2, f"recheck:{b2}:2")]


def test_a_rollback_says_what_it_reverted_excludes_by_default_and_requeues_on_request(deployed, tmp_path):
    """Before: after rolling v3 back to v2 its batch was gone for good (a resubmission is a
    duplicate), the next batch branched from the old index, and a later retrain brought the
    rolled-back batch back even when it was bad."""
    import dagster as dg

    from model_code.freshness.deployment import rollback
    from model_code.freshness.inbox import Inbox
    from orchestration.resources import ParamsResource, WorkspaceResource
    from orchestration.sensors import inbox_sensor

    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    inbox = Inbox(layout.inbox, settle_seconds=0)
    for number in (1, 2, 3):
        write_batch(layout.inbox / f"b{number}.jsonl",
                    [{"_id": f"new-{number}", "title": "volcano", "text": f"lava magma crater {number}"}])
    inbox.receive()
    b1, b2, b3 = sorted(inbox.batches(), key=lambda b: b.name)
    apply_batch(registry, params, layout, b1.path)
    apply_batch(registry, params, layout, b2.path)  # champion v3 serves new-1 and new-2

    undone = rollback(registry, layout)  # default: the reverted batch is excluded
    assert undone == {"from_version": 3, "to_version": 2, "reverted_batches": [b2.batch_id], "reverted_as": "excluded",
                      "restored_batches": []}
    assert apply_batch(registry, params, layout, b2.path)["status"] == "skipped"  # never applied again
    included = {doc for batch in inbox.included() for doc in inbox.read(batch).documents["doc_id"]}
    assert included == {"new-1", "new-3"}  # what a retrain would ingest
    third = apply_batch(registry, params, layout, b3.path)  # branches from the served v2, not from v3
    served = served_documents(uri, str(third["registered_version"]), layout, params)
    assert {"new-1", "new-3"} <= served and "new-2" not in served

    requeued = rollback(registry, layout, requeue=True)  # v4 back to v2: b3 is applied again
    assert requeued["reverted_batches"] == [b3.batch_id] and requeued["reverted_as"] == "requeued"
    with dg.instance_for_test() as instance:
        result = inbox_sensor(dg.build_sensor_context(
            instance=instance, resources={"workspace": WorkspaceResource(root=str(layout.root)),
                                          "params": ParamsResource(path=str(layout.root / "params.yaml"))}))
        assert [r.run_key for r in result.run_requests if r.run_key.startswith("requeue:")] == [
            f"requeue:{b3.batch_id}:2"]
    again = apply_batch(registry, params, layout, b3.path)  # what that run's update does
    assert "new-3" in served_documents(uri, str(again["registered_version"]), layout, params)


def test_a_rollback_undone_puts_the_batches_it_excluded_back_in_the_loop(deployed, tmp_path):
    """Before: v3 rolled back to v2 excluded b2; ``rollback --to 3`` served b2 again but left it
    excluded, so the next retrain ingested without it, could be promoted, and nothing applied
    b2 again: its documents were gone."""
    from model_code.freshness.deployment import rollback
    from model_code.freshness.inbox import Inbox

    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    inbox = Inbox(layout.inbox, settle_seconds=0)
    for number in (1, 2):
        write_batch(layout.inbox / f"b{number}.jsonl",
                    [{"_id": f"new-{number}", "title": "volcano", "text": f"lava magma crater {number}"}])
    inbox.receive()
    b1, b2 = sorted(inbox.batches(), key=lambda b: b.name)
    apply_batch(registry, params, layout, b1.path)
    apply_batch(registry, params, layout, b2.path)  # champion v3 serves new-1 and new-2

    def unreachable(*args, **kwargs):
        raise OSError("test: the tracking server is unreachable")

    with pytest.MonkeyPatch.context() as patch:  # a rollback whose promotion fails changes nothing: before, it left
        patch.setattr(registry, "promote", unreachable)  # b2 excluded while v3 still served it
        with pytest.raises(OSError, match="unreachable"):
            rollback(registry, layout)
    assert not inbox.excluded() and str(registry.champion().version) == "3"
    rollback(registry, layout)
    assert inbox.excluded() == {b2.sha256}
    with pytest.MonkeyPatch.context() as patch:  # nor does undoing it: b2 stays excluded while v2 is champion
        patch.setattr(registry, "promote", unreachable)
        with pytest.raises(OSError, match="unreachable"):
            rollback(registry, layout, to_version="3")
    assert inbox.excluded() == {b2.sha256} and str(registry.champion().version) == "2"
    undone = rollback(registry, layout, to_version="3")
    assert (undone["to_version"], undone["reverted_batches"], undone["restored_batches"]) == (3, [], [b2.batch_id])
    assert not inbox.excluded() and str(registry.champion().version) == "3"
    assert {"new-1", "new-2"} <= served_documents(uri, "3", layout, params)  # what v3 serves ...
    retrain_ingests = {doc for batch in inbox.included() for doc in inbox.read(batch).documents["doc_id"]}
    assert {"new-1", "new-2"} <= retrain_ingests  # ... a retrain ingests
    assert apply_batch(registry, params, layout, b2.path)["status"] == "skipped"  # and nothing applies twice


def test_a_host_without_the_champions_version_on_disk_downloads_it(deployed, tmp_path):
    """Before: only the lineage's base retriever was downloaded, so on a new host (or after the
    deployments directory was wiped) a champion that is an incremental version could not be
    read or updated again. Now each version is a delta of the one before, so the whole chain is
    downloaded (and the lineage's manifests with it)."""
    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    for number in range(2):  # champion v3 = retriever v0002, a delta of v0001, a delta of base
        apply_batch(registry, params, layout, one_document_batch(tmp_path, number)[0])
    shutil.rmtree(layout.deployments)  # a new host
    champion = registry.champion()
    deployment = installed(registry, layout, champion)
    versions = RetrieverVersions(deployment)
    assert [m["delta_of"] for m in versions.manifests(champion.retriever_version)] == ["base", "v0001"]
    assert {"new-0", "new-1"} <= set(versions.load_version(champion.retriever_version).live_ids())
    third = apply_batch(registry, params, layout, one_document_batch(tmp_path, 2)[0])  # and it can be updated
    assert {"new-0", "new-1", "new-2"} <= served_documents(uri, str(third["registered_version"]), layout, params)
    mlflow.set_tracking_uri(uri)  # the registered model alone, replaying its chain of three retriever artifacts
    served = mlflow.pyfunc.load_model(f"models:/{MODEL}/{third['registered_version']}").unwrap_python_model()
    assert {"new-0", "new-1", "new-2"} <= set(served.retriever.live_ids())


def test_a_version_rolled_back_on_another_host_is_never_named_again(deployed, tmp_path):
    """Before: a new version was named after the versions on this host's disk, and a host that
    installed a rolled-back champion (a new host, a wiped disk) lacks the versions after it: the
    next update took the name of the rolled-back one (v0002 twice). A server still on the first
    v0002 then read the second as "nothing to replay" and answered as the new version with the
    old one's documents."""
    from model_code.freshness.deployment import rollback

    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    first, second = (apply_batch(registry, params, layout, one_document_batch(tmp_path, n)[0]) for n in range(2))
    rollback(registry, layout, to_version=str(first["registered_version"]))
    shutil.rmtree(layout.deployments)  # a new host: installs the champion (retriever v0001) and what it holds
    third = apply_batch(registry, params, layout, one_document_batch(tmp_path, 2)[0])
    client = MlflowClient(tracking_uri=uri)
    names = [client.get_model_version(MODEL, str(result["registered_version"])).tags["retriever_version"]
             for result in (first, second, third)]
    assert names == ["v0001", "v0002", "v0003"]
    served = served_documents(uri, str(third["registered_version"]), layout, params)
    assert {"new-0", "new-2"} <= served and "new-1" not in served


def test_in_flight_volume_counts_queued_updates_only(tmp_path):
    """Before: a pending report (no deployment) crashed every later drift report; batches decided
    "retrain" (now applied incrementally too) were not counted; excluded ones were counted."""
    from model_code.freshness.report import in_flight_documents, pending

    deployment = Layout(tmp_path / "deployed" / "v1")
    reports = tmp_path / "drift"

    def write(batch: str, decision: str, documents: int) -> None:
        (reports / batch).mkdir(parents=True)
        (reports / batch / "report.json").write_text(json.dumps(
            {"deployment": str(deployment.root), "decision": decision, "documents": documents}))

    pending(reports / "aaaa", "no champion yet")  # a pending report has no deployment
    write("bbbb", "incremental", 3)  # applied already
    write("cccc", "incremental", 5)  # queued
    write("dddd", "retrain", 7)  # queued too: retrain batches are applied incrementally meanwhile
    write("eeee", "incremental", 11)  # excluded by a rollback: never applied
    write("ffff", "none", 13)
    applied, excluded = {"bbbb" + "0" * 48}, {"eeee" + "0" * 48}
    assert in_flight_documents(reports / "zzzz", deployment, applied, excluded) == 5 + 7
    assert in_flight_documents(reports / "cccc", deployment, applied, excluded) == 7  # not itself


def test_batches_a_retrain_ingested_are_reverted_by_a_rollback_and_never_promoted_again(deployed, tmp_path):
    """Before: a rollback only saw incrementally added batches, so one a retrain had ingested
    was neither excluded nor re-queued, and a retrain holding an excluded batch could be promoted."""
    from model_code.cli import main
    from model_code.freshness.deployment import rollback
    from model_code.freshness.inbox import Inbox
    from tracking.registry import register

    params, layout, uri = deployed
    inbox = Inbox(layout.inbox, settle_seconds=0)
    write_batch(layout.inbox / "b1.jsonl", [{"_id": "new-1", "title": "volcano", "text": "lava magma crater"}])
    inbox.receive()
    [b1] = inbox.batches()
    retrain_params = tmp_path / "retrain.yaml"  # what full_retrain runs: the corpus plus every accepted batch
    retrain_params.write_text(yaml.safe_dump(yaml.safe_load((layout.root / "params.yaml").read_text())
                                             | {"data": {**params.data.model_dump(), "include_incoming": True}}))
    for stage in ("ingest", "querygen", "cluster", "train", "index", "evaluate"):
        assert main([stage, "--params", str(retrain_params), "--root", str(layout.root)]) == 0
    retrain = register(load_params(retrain_params), layout, tracking_uri=uri)
    registry = MlflowRegistry(params, layout, uri)
    assert registry.version(str(retrain["version"])).tags["included_batches"] == b1.batch_id
    registry.promote(str(retrain["version"]), "test: the retrain won")
    late = apply_batch(registry, params, layout, b1.path)  # its update ran after the retrain it was waiting for
    assert late == {"status": "skipped", "reason": f"batch already served by champion v{retrain['version']}"}

    undone = rollback(registry, layout, to_version="1")
    assert undone["reverted_batches"] == [b1.batch_id] and inbox.excluded() == {b1.sha256}
    again = register(load_params(retrain_params), layout, tracking_uri=uri)  # the same merged corpus
    assert again["alias"] == "challenger" and b1.batch_id in again["reason"]


def test_a_replaced_directory_is_never_missing_for_a_reader(tmp_path):
    """Before: a directory was replaced by two renames, and a kill (or a reader) between them found
    the path missing (models/index vanished, both copies stranded in a temporary directory)."""
    from model_code.io import atomic_path

    target = tmp_path / "index"
    with atomic_path(target) as out:
        out.mkdir()
        (out / "version").write_text("0")
    stop, misses = threading.Event(), []

    def read():
        while not stop.is_set():
            try:
                (target / "version").read_text()
            except FileNotFoundError:
                misses.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for number in range(1, 201):
            with atomic_path(target) as out:
                out.mkdir()
                (out / "version").write_text(str(number))
    finally:
        stop.set()
        reader.join()
    assert not misses and (target / "version").read_text() == "200"
    assert [p.name for p in tmp_path.iterdir()] == ["index"]  # no stranded copies


KILL_AT_STEP = """
import contextlib, os, signal, sys
from mlflow import MlflowClient
import mlflow
from model_code.freshness import deployment, report
from tests.helpers.batch_processing import process_batch

root, uri, batch_id, step = sys.argv[1:5]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def die_after(owner, name):
    original = getattr(owner, name)
    def wrapped(*args, **kwargs):
        original(*args, **kwargs)
        die()
    setattr(owner, name, wrapped)

if step == "report":  # the report written in its temporary directory, not renamed into place yet
    write = report.atomic_path
    @contextlib.contextmanager
    def dying(target):
        with write(target) as out:
            yield out
            die()
    report.atomic_path = dying
elif step == "apply":  # the new retriever version written, nothing registered
    die_after(deployment.apply, "upsert_documents")
elif step == "register":  # the model version created, the champion alias not moved
    die_after(mlflow, "register_model")
elif step == "alias":  # the alias moved, the run not finished
    die_after(MlflowClient, "set_registered_model_alias")
process_batch(root, uri, batch_id)
"""


def test_a_kill_at_each_step_of_an_update_leaves_every_batch_served_exactly_once(deployed, tmp_path):
    """kill -9 at each step of receive -> report -> apply -> register -> alias, one batch per step,
    then what the retried run does; afterwards the ledger, the registry's champion chain and what
    the champion serves agree: every accepted batch once, in order. (Receive: see
    ``test_a_kill_while_accepting_a_batch_loses_nothing_and_accepts_it_once``.)"""
    import subprocess
    import sys

    from model_code.freshness.deployment import served_batches
    from model_code.freshness.inbox import Inbox

    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    inbox = Inbox(layout.inbox, settle_seconds=0)
    steps = ("report", "apply", "register", "alias")
    for number, step in enumerate(steps):
        write_batch(layout.inbox / f"b{number}.jsonl",
                    [{"_id": f"new-{number}", "title": f"volcano {number}", "text": f"lava magma crater {number}"}])
        [batch] = [b.batch_id for b in inbox.receive()["accepted"]]
        killed = subprocess.run([sys.executable, "-c", KILL_AT_STEP, str(layout.root), uri, batch, step],
                                cwd=REPOSITORY, check=False, capture_output=True, text=True)
        assert killed.returncode == -9, (step, killed.stderr[-3000:])
        outcome = process_batch(str(layout.root), uri, batch)  # the retried run
        if step == "alias":  # the killed run had finished its work: the retry finds the batch served
            assert outcome["status"] == "skipped" and outcome["reason"].startswith("batch already served")
        else:
            assert "registered_version" in outcome, (step, outcome)

    ledger = [b.sha256 for b in inbox.batches()]
    champion = registry.champion()
    assert list(served_batches(registry, champion).values()) == ledger  # the registry: each batch once, in order
    deployment = installed(registry, layout, champion)
    chain = RetrieverVersions(deployment).manifests(champion.retriever_version)
    assert [m["batch_sha256"] for m in chain] == ledger  # the retriever versions agree
    served = served_documents(uri, champion.version, layout, params)
    assert {f"new-{n}" for n in range(len(steps))} <= served
    decisions = [json.loads((layout.drift_reports / b.batch_id / "report.json").read_text())["decision"]
                 for b in inbox.batches()]
    # the last retry's report: the batch is applied already, so it is measured against the version it was applied
    # to, as on arrival (not against the champion that holds it, where nothing would be new)
    assert decisions == ["incremental", "incremental", "incremental", "incremental"]
