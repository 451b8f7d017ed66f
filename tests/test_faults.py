"""Fault suite of the deployment path (issue: the freshness loop applies every batch exactly once):
races between readers and writers of one deployment, concurrent first checkouts, vectors made by
another champion's encoder. Each test reproduces a failure seen before the fix and checks that
the registry, the retriever versions and what the champion serves agree."""

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from model_code.config import load_params
from model_code.freshness.deployment import apply_batch, checkout, installed
from model_code.incremental import updates
from model_code.incremental.updates import RetrieverVersions
from model_code.layout import Layout
from tests.test_freshness import write_batch
from tests.test_freshness_loop import MODEL, deploy
from tracking.deployment import MlflowRegistry


@pytest.fixture
def deployed(tmp_path, beir_dir, tiny_model_dir):
    root, uri, _ = deploy(tmp_path, beir_dir, tiny_model_dir, "dense")
    return load_params(root / "params.yaml"), Layout(root), uri


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
    add_documents = updates.add_documents

    def after_a_stray_checkout(deployment, *args, **kwargs):
        RetrieverVersions(deployment).checkout("base")  # what an unlocked reader's checkout could do
        return add_documents(deployment, *args, **kwargs)

    monkeypatch.setattr(updates, "add_documents", after_a_stray_checkout)
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
    expected = RetrieverVersions(deployment).load_version("base").encoder.embed_texts([f"{text['title']}. {text['text']}"])[0]
    assert float(stored_vector(result, doc_id) @ expected) > 0.999  # encoded again by the champion's encoder

    batch, doc_id = one_document_batch(tmp_path, 1)
    fresh = rng.normal(size=384).astype(np.float32)
    fresh /= np.linalg.norm(fresh)
    result = apply_batch(registry, params, layout, batch, ({doc_id: fresh}, registry.champion().encoder_fingerprint))
    assert np.allclose(stored_vector(result, doc_id), fresh)  # the champion's own vectors are reused


KILL_AT_MOVE = """
import os, signal, sys
from pathlib import Path
import model_code.freshness.inbox as inbox_module

real_replace = os.replace

def replace(source, target):  # kill -9 the moment the file would leave the inbox
    if Path(target).parent.name == "accepted":
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(source, target)

inbox_module.os.replace = replace
inbox_module.Inbox(Path(sys.argv[1]), settle_seconds=0).receive()
"""


def test_a_kill_while_accepting_a_batch_loses_nothing_and_accepts_it_once(tmp_path):
    """Before: the file moved to accepted/ first and the ledger line came second; a kill between
    the two left the file accepted and the ledger without it, so the batch was never applied."""
    import subprocess
    import sys

    from model_code.freshness.inbox import Inbox

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    inbox.root.mkdir()
    write_batch(inbox.root / "b1.jsonl", [{"_id": "d1", "title": "t", "text": "lava magma eruption"}])
    killed = subprocess.run([sys.executable, "-c", KILL_AT_MOVE, str(inbox.root)], cwd=Path(__file__).parents[1],
                            check=False)
    assert killed.returncode == -9  # died at the move, after the ledger line
    [batch] = inbox.batches()
    assert not batch.path.exists() and (inbox.root / "b1.jsonl").exists()  # recorded, still waiting
    outcome = inbox.receive()  # the next sensor tick finishes the move
    assert outcome == {"accepted": [], "duplicates": [], "quarantined": []}
    assert [b.batch_id for b in inbox.batches()] == [batch.batch_id] and batch.path.exists()
    assert not (inbox.root / "b1.jsonl").exists() and not inbox.duplicates_dir.exists()
    assert inbox.receive() == {"accepted": [], "duplicates": [], "quarantined": []}  # nothing left, nothing twice


def test_a_sensor_tick_that_died_after_adding_the_partition_requests_the_run_again(tmp_path):
    """Before: runs were requested only for batches without a partition, and the daemon adds
    partitions before it saves the run requests: a crash between the two dropped the batch."""
    import dagster as dg

    from assets.incoming import incoming_batch
    from orchestration.resources import WorkspaceResource
    from orchestration.sensors import inbox_sensor

    root = tmp_path / "workspace"
    write_batch(root / "inbox" / "b1.jsonl", [{"_id": "d1", "title": "t", "text": "lava magma eruption"}])
    resources = {"workspace": WorkspaceResource(root=str(root))}
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

    from assets.incoming import INCOMING_ASSETS_RETRY, champion_update

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(Path(__file__).parents[1] / "orchestration" / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_runtime_seconds > 0
    assert champion_update.op.retry_policy == INCOMING_ASSETS_RETRY
