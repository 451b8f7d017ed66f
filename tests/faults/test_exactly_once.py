"""Exactly once in ordinary operation (issue 43): each test stages a situation that lost, doubled or
half-took an accepted batch before the fix (a second process, a writer that pauses, a retrain
racing an inbox writer, two CLI updates at once, the same id in two batches, a poison row) and
then compares the inbox ledger, the registry's chain and what the champion pyfunc serves."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import yaml

from model_code.cli import main
from model_code.config import load_params
from model_code.freshness import report
from model_code.freshness.deployment import apply_batch, exclude_batches, installed, served_batches
from model_code.freshness.inbox import Inbox
from model_code.layout import Layout
from model_code.versions.chain import RetrieverVersions
from tests.conftest import REPOSITORY
from tests.helpers.batches import write_batch
from tests.helpers.deployment import MODEL
from tracking.deployment import MlflowRegistry


def doc(doc_id: str, text: str) -> dict:
    return {"_id": doc_id, "title": f"about {doc_id}", "text": text}


def served_by_the_champion(uri: str) -> set[str]:
    """The document ids the champion's pyfunc answers from, loaded as a server loads it."""
    mlflow.set_tracking_uri(uri)
    return set(mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").unwrap_python_model().retriever.live_ids())


def stored_vector(registry: MlflowRegistry, layout: Layout, doc_id: str) -> np.ndarray:
    champion = registry.champion()
    retriever = RetrieverVersions(installed(registry, layout, champion)).load_version(champion.retriever_version)
    return retriever.index.vectors([doc_id])[0]


def encoded(registry: MlflowRegistry, layout: Layout, document: dict) -> np.ndarray:
    champion = registry.champion()
    base = RetrieverVersions(installed(registry, layout, champion)).load_version("base")
    return base.encoder.embed_texts([f"{document['title']} {document['text']}"])[0]


def assert_ledger_served_once_in_order(registry: MlflowRegistry, inbox: Inbox) -> None:
    """The registry's chain of the champion names every included batch once, in ledger order."""
    served = list(served_batches(registry, registry.champion()))
    assert served == [b.batch_id for b in inbox.included()]


# -- 1. a retrain's corpus and its claimed batches are one snapshot -------------------------------------

WRITER = """
import json, sys, time
from pathlib import Path
from model_code.freshness.inbox import Inbox

inbox, stop = Inbox(Path(sys.argv[1]), settle_seconds=0), Path(sys.argv[2])
number = 0
while not stop.exists():
    (inbox.root / f".w{number}").write_text(json.dumps({"_id": f"late-{number}", "title": "volcano",
                                                         "text": f"lava magma crater number {number}"}) + "\\n")
    (inbox.root / f".w{number}").rename(inbox.root / f"w{number}.jsonl")
    inbox.receive()
    number += 1
    time.sleep(0.2)
"""


def test_a_retrain_claims_exactly_the_batches_it_ingested_and_a_promoted_one_gets_the_rest(deployed, tmp_path):
    """Before: ingest read the inbox's documents, then listed the included batches seconds later;
    with a writer receiving a batch every 0.2 s the retrain claimed batches it never ingested, and
    once promoted each was skipped as 'already served'. Now the claim is exactly what it read, and
    the next update after the promotion applies every later batch, in ledger order."""
    params, layout, uri = deployed
    inbox = Inbox(layout.inbox, settle_seconds=0)
    write_batch(layout.inbox / "first.jsonl", [doc("early-0", "lava magma crater early")])
    inbox.receive()
    retrain_params = tmp_path / "retrain.yaml"
    retrain_params.write_text(yaml.safe_dump(yaml.safe_load((layout.root / "params.yaml").read_text())
                                             | {"data": {**params.data.model_dump(), "include_incoming": True}}))
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(layout.inbox), str(stop)], cwd=REPOSITORY)
    try:
        while len(inbox.batches()) < 3:  # the writer is running
            time.sleep(0.1)
        for stage in ("ingest", "querygen", "cluster", "train", "index", "evaluate"):
            assert main([stage, "--params", str(retrain_params), "--root", str(layout.root)]) == 0
    finally:
        stop.touch()
        assert writer.wait(timeout=60) == 0
    claimed = json.loads((layout.ingest_report / "summary.json").read_text())["incoming_batches"]
    corpus = set(pd.read_parquet(layout.ingested / "corpus.parquet")["doc_id"])
    holding = [b.batch_id for b in inbox.batches() if set(inbox.read(b).documents["doc_id"]) <= corpus]
    assert claimed == holding and len(claimed) < len(inbox.batches())  # some arrived after the ingest

    from tracking.registry import register

    registry = MlflowRegistry(params, layout, uri)
    retrain = register(load_params(retrain_params), layout, tracking_uri=uri)
    registry.promote(str(retrain["version"]), "test: the retrain won")
    last = inbox.batches()[-1]
    result = apply_batch(registry, params, layout, last.path)  # the next update, e.g. the catch-up run
    assert result["caught_up"] == [b.batch_id for b in inbox.batches()[len(claimed):-1]]
    assert_ledger_served_once_in_order(registry, inbox)
    every = {d for b in inbox.batches() for d in inbox.read(b).documents["doc_id"]}
    assert every <= served_by_the_champion(uri)


# -- 2. two receivers at once ---------------------------------------------------------------------------

RECEIVER = """
import json, sys, time
from pathlib import Path
from model_code.freshness.inbox import Inbox
while not Path(sys.argv[2]).exists():  # both start receiving at the same moment
    time.sleep(0.01)
print(json.dumps({k: [getattr(b, "batch_id", b) for b in v] for k, v in Inbox(Path(sys.argv[1]), settle_seconds=0).receive().items()}))
"""


def test_two_receivers_at_once_accept_a_file_once(tmp_path):
    """Before: two sensor ticks on one large file both accepted it (two ledger lines, every
    document read twice) and one of them failed moving a file the other had taken."""
    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    documents = [doc(f"d{i}", f"document number {i} about lava and magma") for i in range(20_000)]
    write_batch(inbox.root / "big.jsonl", documents)
    go = tmp_path / "go"
    receivers = [subprocess.Popen([sys.executable, "-c", RECEIVER, str(inbox.root), str(go)], cwd=REPOSITORY,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(3)  # both have imported and wait
    go.touch()
    outcomes = [json.loads(r.communicate(timeout=300)[0]) for r in receivers]
    assert [r.returncode for r in receivers] == [0, 0]
    assert sorted(len(o["accepted"]) for o in outcomes) == [0, 1] and not any(o["duplicates"] for o in outcomes)
    [batch] = inbox.batches()
    assert len(inbox.read(batch).documents) == 20_000 and not (inbox.root / "big.jsonl").exists()


# -- 3. a file still being written ----------------------------------------------------------------------

def test_a_file_written_in_place_is_taken_whole_and_the_accepted_copy_never_changes(tmp_path):
    """Before: a file written straight into the inbox with pauses longer than the settle time was
    accepted as a prefix, and the writer's later lines went into the moved, accepted file (the
    ledger's hash no longer named what was served); a pause inside a line quarantined the file.
    Here the writer keeps the file open and pauses 3x the settle time between lines and inside
    one, while the inbox is looked at every 50 ms."""
    inbox = Inbox(tmp_path / "inbox", settle_seconds=0.2)
    inbox.root.mkdir()
    lines = [json.dumps(doc(f"w{i}", f"lava flow number {i}")) + "\n" for i in range(3)]
    path = inbox.root / "written.jsonl"
    seen = []
    with open(path, "w") as writer:
        for piece in [lines[0], lines[1][:15], lines[1][15:], lines[2]]:
            writer.write(piece)
            writer.flush()
            deadline = time.time() + 0.6
            while time.time() < deadline:
                seen.append(inbox.receive())
                time.sleep(0.05)
    assert all(o == {"accepted": [], "duplicates": [], "quarantined": []} for o in seen)  # nothing while open
    # closed, but the last line lacks its newline: still being written, most likely
    with open(path, "a") as writer:
        writer.write(json.dumps(doc("w3", "lava flow number 3")))
    os.utime(path, (time.time() - 1, time.time() - 1))  # quiet for longer than the settle time
    assert inbox.receive() == {"accepted": [], "duplicates": [], "quarantined": []}
    with open(path, "a") as writer:
        writer.write("\n")
    final = path.read_bytes()
    os.utime(path, (time.time() - 1, time.time() - 1))
    [batch] = inbox.receive()["accepted"]
    assert batch.documents == 4 and batch.path.read_bytes() == final
    import hashlib

    assert hashlib.sha256(batch.path.read_bytes()).hexdigest() == batch.sha256  # the ledger names what is kept
    assert not path.exists()  # a later write to the dropped file cannot reach the accepted copy


# -- 4. two CLI updates at once -------------------------------------------------------------------------

def test_two_add_documents_at_once_run_one_after_the_other(deployed, tmp_path):
    """Before: two concurrent ``fresh-retriever add-documents`` both branched from the same
    version and both exited 0; the current version served only the second file's documents."""
    _, layout, _ = deployed
    files = [write_batch(tmp_path / f"add{n}.jsonl", [doc(f"cli{n}-{i}", f"lava magma crater {n} {i}") for i in range(50)])
             for n in range(2)]
    command = [sys.executable, "-m", "model_code.cli", "add-documents"]
    runs = [subprocess.Popen([*command, str(f), "--params", str(layout.root / "params.yaml"), "--root", str(layout.root)],
                             cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for f in files]
    assert [r.wait(timeout=300) for r in runs] == [0, 0], [r.stderr.read()[-2000:] for r in runs]
    versions = RetrieverVersions(layout)
    chain = versions.manifests()
    assert [m["parent"] for m in chain] == ["base", chain[0]["version"]]  # the second built on the first
    live = set(versions.load().live_ids())
    assert {f"cli{n}-{i}" for n in range(2) for i in range(50)} <= live


# -- 5. ids: upserts, deletions, the same id in two batches ----------------------------------------------

def measure_and_apply(params, layout: Layout, registry: MlflowRegistry, batch_ids: list[str]) -> list[dict]:
    """Every batch's drift report against the current champion first (as when their process
    runs finish before any update), then their updates in the order given."""
    from model_code.data.ingested import load_ingested

    inbox = Inbox(layout.inbox)
    champion = registry.champion()
    for batch_id in batch_ids:
        report.run(params, installed(registry, layout, champion), champion.retriever_version,
                   load_ingested(layout.ingested), inbox.read(inbox.batch(batch_id)).documents,
                   layout.drift_reports / batch_id, champion.encoder_fingerprint, passage_text=champion.passage_text)
    return [apply_batch(registry, params, layout, inbox.batch(b).path, report.load_embeddings(layout.drift_reports / b))
            for b in batch_ids]


def test_ids_are_upserted_deleted_and_applied_in_ledger_order_whichever_update_runs_first(deployed):
    """Before: the same id in two in-flight batches failed the second update with advice that
    edited the workspace, not the champion; an indexed id sent with new text was accepted and
    never served. Now a batch row replaces an indexed document, ``deleted: true`` removes one,
    and batches apply in ledger order even when the later one's update runs first."""
    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    inbox = Inbox(layout.inbox, settle_seconds=0)
    first, second = doc("dup", "lava magma eruption crater"), doc("dup", "orchestra melody chord rhythm")
    edited = doc("astronomy-0", "volcano lava magma basalt eruption")  # indexed by the base
    for name, rows in (("a", [first]), ("b", [second, edited])):
        write_batch(layout.inbox / f"{name}.jsonl", rows)
        inbox.receive()
    a, b = [x.batch_id for x in inbox.batches()]
    [late] = measure_and_apply(params, layout, registry, [b])  # b's update runs first
    assert late["caught_up"] == [a] and (late["added"], late["edited"]) == (0, 2)  # a added dup, b replaced it
    assert measure_and_apply(params, layout, registry, [a])[0]["status"] == "skipped"  # a's own run, later
    for document in (second, edited):  # served with the text of the latest batch that holds it
        assert float(stored_vector(registry, layout, document["_id"]) @ encoded(registry, layout, document)) > 0.999

    write_batch(layout.inbox / "c.jsonl", [{"_id": "dup", "deleted": True}, {"_id": "never-there", "deleted": True}])
    [c] = inbox.receive()["accepted"]
    [removal] = measure_and_apply(params, layout, registry, [c.batch_id])
    assert (removal["removed"], removal["rejected"]) == (1, 1) and "dup" not in served_by_the_champion(uri)
    third = doc("dup", "football goal league stadium")
    write_batch(layout.inbox / "d.jsonl", [third])
    [d] = inbox.receive()["accepted"]
    assert measure_and_apply(params, layout, registry, [d.batch_id])[0]["added"] == 1  # re-added after the removal
    assert float(stored_vector(registry, layout, "dup") @ encoded(registry, layout, third)) > 0.999
    assert_ledger_served_once_in_order(registry, inbox)
    assert {"dup", "astronomy-0"} <= served_by_the_champion(uri)


# -- 6. a poison row, and a batch excluded before it was served ------------------------------------------

def test_unencodable_text_is_rejected_at_every_entry_point_naming_file_line_and_field(deployed, tmp_path, capsys):
    """Before: a lone surrogate (valid JSON, pure ASCII) was accepted everywhere, then failed the
    batch's update three times with UnicodeEncodeError, add-documents with a raw traceback, and
    every later retrain's ingest."""
    params, layout, _ = deployed
    rows = '{"_id": "ok", "text": "lava magma crater"}\n{"_id": "bad", "text": "lava \\ud800 magma"}\n'
    batch = tmp_path / "poison.jsonl"
    batch.write_text(rows)
    params_file = str(layout.root / "params.yaml")

    assert main(["submit-documents", str(batch), "--root", str(layout.root), "--params", params_file]) == 0
    out, err = capsys.readouterr()
    assert "1 documents, 0 deletions, 1 rows rejected" in out
    assert "rejected poison.jsonl:2: text: not encodable as UTF-8" in err
    inbox = Inbox(layout.inbox, settle_seconds=0, data=params.data)
    [accepted] = inbox.receive()["accepted"]
    assert (accepted.documents, accepted.rejected) == (1, 1)

    only_bad = tmp_path / "only-bad.jsonl"
    only_bad.write_text('{"_id": "bad", "text": "lava \\ud800 magma"}\n')
    assert main(["add-documents", str(only_bad), "--params", params_file, "--root", str(layout.root)]) == 2
    err = capsys.readouterr().err
    assert "only-bad.jsonl:1: text: not encodable as UTF-8" in err and "Traceback" not in err
    assert main(["submit-documents", str(only_bad), "--root", str(layout.root), "--params", params_file]) == 2
    assert "no valid document (1 rows rejected; first: only-bad.jsonl:1: text: not encodable" in capsys.readouterr().err

    import shutil

    beir = shutil.copytree(params.data.path, tmp_path / "beir")  # the deployment's source is shared by other tests
    with open(beir / "corpus.jsonl", "a") as handle:
        handle.write('{"_id": "poison-doc", "title": "t", "text": "lava \\ud800 magma"}\n')
    poisoned = tmp_path / "poisoned.yaml"
    poisoned.write_text(yaml.safe_dump(yaml.safe_load(Path(params_file).read_text())
                                       | {"data": {**params.data.model_dump(), "path": str(beir)}}))
    assert main(["ingest", "--params", str(poisoned), "--root", str(layout.root)]) == 0  # a retrain's first stage
    rejects = [json.loads(line) for line in (layout.ingest_report / "rejects.jsonl").read_text().splitlines()]
    assert [(r["row"]["doc_id"], r["field"]) for r in rejects if "encodable" in r["reason"]] == [("poison-doc", "text")]


def test_an_accepted_batch_never_served_can_be_excluded_and_nothing_after_it_waits(deployed):
    """A batch whose update keeps failing would hold back every later one (batches apply in
    ledger order): ``exclude_batches`` takes it out of updates and retrains; a served batch is
    refused (a rollback takes it out)."""
    from model_code.stages.ingest import read_source

    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    inbox = Inbox(layout.inbox, settle_seconds=0)
    for name in ("stuck", "next"):
        write_batch(layout.inbox / f"{name}.jsonl", [doc(name, f"lava magma crater {name}")])
        inbox.receive()
    stuck, after = inbox.batches()
    assert [r["batch_id"] for r in exclude_batches(registry, layout, [stuck.batch_id], "its update fails")] == [stuck.batch_id]
    result = apply_batch(registry, params, layout, after.path)
    assert result["caught_up"] == [] and list(served_batches(registry, registry.champion())) == [after.batch_id]
    assert apply_batch(registry, params, layout, stuck.path)["status"] == "skipped"
    _, claimed = read_source(params.data.model_copy(update={"include_incoming": True}), layout.root)
    assert [batch_id for batch_id, _ in claimed] == [after.batch_id]
    with pytest.raises(ValueError, match=rf"serves {after.batch_id}: take them out with fresh-registry rollback"):
        exclude_batches(registry, layout, [after.batch_id], "too late")
    assert served_by_the_champion(uri) >= {"next"} and "stuck" not in served_by_the_champion(uri)


# -- the drift sensor's catch-up after a promotion that left batches out -----------------------------

def test_the_drift_sensor_applies_a_batch_the_promoted_champion_lacks(tmp_path, tiny_model_dir):
    """A batch served by the old champion, then a champion promoted that never held it (as a
    retrain that ingested before the batch arrived): with no report to read and no update in
    flight, the drift sensor requests one catch-up update per champion; when that run fails the
    sensor says so (and requests nothing more), and once it succeeds the batch is served. Before,
    nothing applied it again: the registry's chain kept it, the champion not."""
    import dagster as dg

    from assets import incoming
    from orchestration.definitions import defs
    from orchestration.sensors import drift_sensor
    from tests.helpers.deployment import IN_DOMAIN, deploy, receive, tick

    root, uri, resources = deploy(tmp_path, tiny_model_dir, "dense")
    params, layout = load_params(root / "params.yaml"), Layout(root)
    registry = MlflowRegistry(params, layout, uri)
    job = defs.resolve_job_def("incremental_update")
    with dg.instance_for_test() as instance:
        write_batch(layout.inbox / "a.jsonl", IN_DOMAIN)
        [batch] = receive(instance, resources)
        assert defs.resolve_job_def("process_incoming_batch").execute_in_process(  # measured and applied
            partition_key=batch, instance=instance, resources=resources).success
        first = tick(drift_sensor, instance, resources)
        assert not first.run_requests  # it is served

        registry.promote("1", "test: a retrain that never held the batch won")
        [catch_up] = tick(drift_sensor, instance, resources, cursor=first.cursor).run_requests
        assert (catch_up.partition_key, catch_up.run_key) == (batch, f"catchup:{batch}:1")
        cancelled = instance.create_run_for_job(job, tags=catch_up.tags, status=dg.DagsterRunStatus.CANCELED)
        stuck = tick(drift_sensor, instance, resources, cursor=first.cursor)  # before: skipped without a word
        assert isinstance(stuck, dg.SkipReason) and f"onto champion v1 was cancelled (run {cancelled.run_id})" in \
            stuck.skip_message
        instance.delete_run(cancelled.run_id)

        def failing(*args, **kwargs):
            raise dg.Failure("test: the catch-up fails", allow_retries=False)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(incoming, "apply_batch", failing)
            failed = job.execute_in_process(partition_key=batch, instance=instance, resources=resources,
                                            tags=catch_up.tags, raise_on_error=False)
        assert not failed.success
        stuck = tick(drift_sensor, instance, resources, cursor=first.cursor)  # no second request under that key
        assert isinstance(stuck, dg.SkipReason) and f"the catch-up of batch {batch} onto champion v1 failed (run " \
            f"{failed.run_id})" in stuck.skip_message and f"fresh-registry exclude-batches {batch}" in stuck.skip_message
        assert job.execute_in_process(partition_key=batch, instance=instance, resources=resources,
                                      tags=catch_up.tags).success  # the operator re-executes it
        assert list(served_batches(registry, registry.champion())) == [batch]
        assert registry.champion().tags["parent_version"] == "1"
        assert {"astronomy-new", "cooking-new"} <= served_by_the_champion(uri)
        assert isinstance(tick(drift_sensor, instance, resources, cursor=first.cursor), dg.SkipReason)


def test_a_batch_whose_own_run_was_cancelled_is_named_not_left_waiting_without_a_word(tmp_path, tiny_model_dir):
    """Before: a cancelled ``process_incoming_batch`` run left its batch unserved for ever (its run
    key makes Dagster drop every new request; the failure sensor fires on failures only) and the
    drift sensor skipped without a word. Now its skip reason names the run and what to do."""
    import dagster as dg

    from orchestration.definitions import defs
    from orchestration.sensors import drift_sensor
    from tests.helpers.deployment import IN_DOMAIN, deploy, receive, tick

    root, uri, resources = deploy(tmp_path, tiny_model_dir, "dense")
    registry = MlflowRegistry(load_params(root / "params.yaml"), Layout(root), uri)
    job = defs.resolve_job_def("process_incoming_batch")
    with dg.instance_for_test() as instance:
        write_batch(Layout(root).inbox / "a.jsonl", IN_DOMAIN)
        [batch] = receive(instance, resources)
        cancelled = instance.create_run_for_job(job, tags={"dagster/partition": batch},
                                                status=dg.DagsterRunStatus.CANCELED)
        stuck = tick(drift_sensor, instance, resources)
        assert isinstance(stuck, dg.SkipReason) and f"the run of batch {batch} was cancelled (run " \
            f"{cancelled.run_id})" in stuck.skip_message and f"exclude-batches {batch}" in stuck.skip_message
        write_batch(Layout(root).inbox / "b.jsonl", [{"_id": "later", "title": "later", "text": "basalt flow"}])
        later = receive(instance, resources)[-1]  # the cancelled batch is requested again too (its run key drops it)
        assert job.execute_in_process(partition_key=later, instance=instance, resources=resources).success
        assert list(served_batches(registry, registry.champion())) == [batch, later]  # the later run applied both
        registry.promote("1", "test: a retrain that holds neither batch won")
        read = tick(drift_sensor, instance, resources)  # the later batch's drift report
        [catch_up] = tick(drift_sensor, instance, resources, cursor=read.cursor).run_requests  # not blocked by a
        assert catch_up.partition_key == later  # batch its own run never applied: the catch-up applies it first


# -- kill -9 during a full retrain ----------------------------------------------------------------------

KILL_IN_RETRAIN = """
import os, signal, sys
from pathlib import Path
import mlflow
from mlflow import MlflowClient
from model_code.cli import main
from model_code.config import load_params
from model_code.layout import Layout
from model_code.training import loop
from tracking.registry import register

root, params_file, uri, point = sys.argv[1:5]

def die_after(owner, name):
    original = getattr(owner, name)
    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    setattr(owner, name, wrapped)

if point == "training":  # the first step's gradients computed, no weight updated
    loop.average_gradients = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
elif point == "registration":  # the model version created, no alias on it
    die_after(mlflow, "register_model")
else:  # the champion alias moved to the retrain, its MLflow run still open
    die_after(MlflowClient, "set_registered_model_alias")
for stage in ("ingest", "querygen", "cluster", "train", "index", "evaluate"):
    assert main([stage, "--params", params_file, "--root", root]) == 0
register(load_params(params_file), Layout(root), tracking_uri=uri)
"""


# registration, between the new version and its alias, is the kill that leaves the most to reconcile; the
# other two points (each about 60 CPU-seconds of a 2-core CI run) are in the slow tier
@pytest.mark.parametrize("point", [pytest.param("training", marks=pytest.mark.slow), "registration",
                                   pytest.param("alias", marks=pytest.mark.slow)])
def test_a_retrain_killed_in_training_or_registration_then_run_again_serves_every_batch_once(deployed, tmp_path, point):
    """kill -9 in a full retrain during training, right after its model version is created, and
    right after its alias moved; then the retrain runs again (a Dagster retry), is promoted, and a
    later batch arrives. Before the retrain's version holds the alias the champion
    and what it serves are unchanged; afterwards the champion serves every batch once, in ledger order."""
    from tracking.registry import register

    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    inbox = Inbox(layout.inbox, settle_seconds=0)
    write_batch(layout.inbox / "b1.jsonl", [doc("before", "lava magma crater before the retrain")])
    [b1] = inbox.receive()["accepted"]
    apply_batch(registry, params, layout, b1.path)
    served_before = registry.champion().version
    retrain_params = tmp_path / "retrain.yaml"
    retrain_params.write_text(yaml.safe_dump(yaml.safe_load((layout.root / "params.yaml").read_text()) | {
        "data": {**params.data.model_dump(), "include_incoming": True},
        "train": {**params.train.model_dump(), "enabled": True, "max_steps": 2},
        "registry": {**params.registry.model_dump(), "min_improvement": 0.0},
    }))
    killed = subprocess.run([sys.executable, "-c", KILL_IN_RETRAIN, str(layout.root), str(retrain_params), uri, point],
                            check=False, cwd=REPOSITORY, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-3000:]
    champion = registry.champion()  # at "alias" the retrain's version when it won, else unchanged
    assert champion.version == served_before or (point == "alias" and champion.tags["included_batches"] == b1.batch_id)
    assert_ledger_served_once_in_order(registry, inbox)
    assert "before" in served_by_the_champion(uri)

    for stage in ("ingest", "querygen", "cluster", "train", "index", "evaluate"):  # the retried run
        assert main([stage, "--params", str(retrain_params), "--root", str(layout.root)]) == 0
    retried = register(load_params(retrain_params), layout, tracking_uri=uri)
    if retried["alias"] != "champion":  # two training steps need not beat the champion: say it won
        registry.promote(str(retried["version"]), "test: the retrain won")
    write_batch(layout.inbox / "b2.jsonl", [doc("after", "lava magma crater after the retrain")])
    [b2] = inbox.receive()["accepted"]
    assert apply_batch(registry, params, layout, b2.path)["caught_up"] == []
    assert_ledger_served_once_in_order(registry, inbox)
    assert {"before", "after"} <= served_by_the_champion(uri)


def test_add_documents_during_an_update_of_the_champion_loses_neither(deployed, tmp_path):
    """``fresh-retriever add-documents`` (the workspace's retriever, a subprocess) while the loop
    applies a batch to the champion (in process): both land, each in its own chain, and neither
    reaches the other's (the CLI never writes the champion: submit a file to the inbox for that)."""
    params, layout, uri = deployed
    registry = MlflowRegistry(params, layout, uri)
    cli_file = write_batch(tmp_path / "cli.jsonl", [doc(f"cli-{i}", f"basalt lava number {i}") for i in range(50)])
    inbox = Inbox(layout.inbox, settle_seconds=0)
    write_batch(layout.inbox / "loop.jsonl", [doc(f"loop-{i}", f"magma crater number {i}") for i in range(50)])
    [batch] = inbox.receive()["accepted"]
    cli = subprocess.Popen([sys.executable, "-m", "model_code.cli", "add-documents", str(cli_file), "--params",
                            str(layout.root / "params.yaml"), "--root", str(layout.root)], cwd=REPOSITORY,
                           stderr=subprocess.PIPE, text=True)
    applied = apply_batch(registry, params, layout, batch.path)
    assert cli.wait(timeout=300) == 0, cli.stderr.read()[-2000:]
    assert applied["added"] == 50
    workspace = set(RetrieverVersions(layout).load().live_ids())
    champion = served_by_the_champion(uri)
    assert {f"cli-{i}" for i in range(50)} <= workspace and not {f"loop-{i}" for i in range(50)} & workspace
    assert {f"loop-{i}" for i in range(50)} <= champion and not {f"cli-{i}" for i in range(50)} & champion
    assert_ledger_served_once_in_order(registry, inbox)


# -- found by review: what a file, a writer or a failed catch-up could still do --------------------------

def test_a_file_no_reader_can_parse_is_quarantined_and_blocks_nothing(tmp_path):
    """Before: JSON nested 5,000 deep (RecursionError) or a parquet ``deleted`` column of nullable
    booleans holding NA (TypeError) made every receive raise, so no later file was ever accepted."""
    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    inbox.root.mkdir()
    (inbox.root / "a-deep.jsonl").write_text("[" * 5000 + "]" * 5000 + "\n")
    pd.DataFrame({"_id": ["gone", "kept"], "text": [None, "lava magma crater"],
                  "deleted": pd.array([True, None], dtype="boolean")}).to_parquet(inbox.root / "b-nullable.parquet")
    pd.DataFrame({"_id": ["x"], "text": ["lava"], "deleted": ["true"]}).to_parquet(inbox.root / "c-strings.parquet")
    pd.DataFrame({"_id": ["gone-too"], "deleted": [True]}).to_parquet(inbox.root / "d-deletions.parquet")
    write_batch(inbox.root / "e-good.jsonl", [doc("good", "lava magma crater")], age_seconds=0)  # written last
    outcome = inbox.receive()  # files are taken in the order they were written
    assert [b.name for b in outcome["accepted"]] == ["b-nullable.parquet", "d-deletions.parquet", "e-good.jsonl"]
    assert outcome["quarantined"] == ["a-deep.jsonl", "c-strings.parquet"]
    errors = {p.name: json.loads(p.read_text())["error"] for p in inbox.quarantine_dir.glob("*.error.json")}
    assert errors["a-deep.jsonl.error.json"] == "a-deep.jsonl:1: JSON nested too deeply to read"
    assert errors["c-strings.parquet.error.json"].startswith("c-strings.parquet: row 1: column 'deleted' must be true")
    nullable, deletions, _ = inbox.batches()
    assert (inbox.read(nullable).deleted, inbox.read(nullable).documents["doc_id"].tolist()) == (["gone"], ["kept"])
    assert inbox.read(deletions).deleted == ["gone-too"]


def test_a_file_the_receiver_cannot_open_is_quarantined_saying_why_and_blocks_nothing(tmp_path, monkeypatch):
    """Before: a file dropped without read permission for the receiver made ``pending`` raise
    PermissionError on every receive, so the sensor failed each tick and nothing after it was
    accepted. (Opening is refused by a patch: the tests may run as root, whom no mode stops.)"""
    import model_code.freshness.inbox as inbox_module

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    write_batch(inbox.root / "a-locked.jsonl", [doc("locked", "lava magma crater")])
    write_batch(inbox.root / "b-good.jsonl", [doc("good", "basalt flow")])

    def refusing(path, *args, **kwargs):
        if "a-locked.jsonl" in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(inbox_module, "open", refusing, raising=False)
    outcome = inbox.receive()
    assert ([b.name for b in outcome["accepted"]], outcome["quarantined"]) == (["b-good.jsonl"], ["a-locked.jsonl"])
    error = json.loads((inbox.quarantine_dir / "a-locked.jsonl.error.json").read_text())["error"]
    assert error.startswith("a-locked.jsonl: cannot be read (Permission denied)")
    assert (inbox.quarantine_dir / "a-locked.jsonl").exists()  # kept, to be dropped again


def test_a_batch_file_over_the_size_limit_is_quarantined_unread_and_refused_at_submit(tmp_path, monkeypatch):
    """Before: any size was read whole in the sensor's process (several times the file in memory),
    so a file of gigabytes could take the receiver down on every tick, ahead of every other file."""
    import model_code.freshness.inbox as inbox_module
    from model_code.config import DataParams
    from model_code.data.tables import IngestError

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0, data=DataParams(max_batch_bytes=200))
    write_batch(inbox.root / "a-big.jsonl", [doc(f"big-{i}", "lava magma crater") for i in range(5)])
    write_batch(inbox.root / "b-small.jsonl", [doc("small", "basalt")])
    size = (inbox.root / "a-big.jsonl").stat().st_size
    assert size > 200 > (inbox.root / "b-small.jsonl").stat().st_size
    read, opened = inbox_module.read_document_batch, []
    monkeypatch.setattr(inbox_module, "read_document_batch", lambda path, *a, **k: opened.append(path) or read(path, *a, **k))
    outcome = inbox.receive()
    assert ([b.name for b in outcome["accepted"]], outcome["quarantined"]) == (["b-small.jsonl"], ["a-big.jsonl"])
    assert len(opened) == 1  # the big one never read
    error = json.loads((inbox.quarantine_dir / "a-big.jsonl.error.json").read_text())["error"]
    assert error == f"a-big.jsonl: {size:,} bytes to read, more than data.max_batch_bytes (200): split it into smaller batches"
    with pytest.raises(IngestError, match=r"more than data.max_batch_bytes \(200\)"):
        inbox.submit(inbox.quarantine_dir / "a-big.jsonl")


def test_a_parquet_batch_is_sized_by_what_reading_it_holds(tmp_path):
    """Parquet compresses and stores a repeated value once: 20 documents of 50,000 letters each are
    a few kilobytes on disk and a megabyte read. The limit is on what reading holds."""
    from model_code.config import DataParams

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0, data=DataParams(max_batch_bytes=500_000))
    inbox.root.mkdir()
    pd.DataFrame({"_id": [f"d{i}" for i in range(20)], "text": ["a" * 50_000] * 20}).to_parquet(
        inbox.root / "packed.parquet")
    assert (inbox.root / "packed.parquet").stat().st_size < 500_000
    outcome = inbox.receive()
    assert (outcome["accepted"], outcome["quarantined"]) == ([], ["packed.parquet"])
    error = json.loads((inbox.quarantine_dir / "packed.parquet.error.json").read_text())["error"]
    assert "bytes to read, more than data.max_batch_bytes (500,000)" in error
    assert int(error.split(": ")[1].split(" ")[0].replace(",", "")) > 500_000  # counted until past the limit


def ledger_disk_full_once(monkeypatch) -> None:
    """The inbox's next ledger write fails as a full disk does; the ones after it succeed."""
    append, failures = Inbox._append, [OSError(28, "No space left on device")]

    def full_once(self, file, records):
        if failures:
            raise failures.pop()
        return append(self, file, records)

    monkeypatch.setattr(Inbox, "_append", full_once)


def test_a_disk_error_while_accepting_leaves_the_batch_for_the_next_receive(tmp_path, monkeypatch):
    """Before: any error after validation (the ledger's disk full, say) quarantined a valid batch
    as "unreadable". Now the receiver's own failure leaves the file claimed, goes on with the
    files after it, and the next receive accepts it."""
    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    write_batch(inbox.root / "a.jsonl", [doc("first", "lava magma crater")])
    write_batch(inbox.root / "b.jsonl", [doc("second", "basalt flow")])
    ledger_disk_full_once(monkeypatch)
    first = inbox.receive()
    assert ([b.name for b in first["accepted"]], first["quarantined"]) == (["b.jsonl"], [])
    assert (inbox.root / ".claimed.a.jsonl").exists()
    assert [b.name for b in inbox.receive()["accepted"]] == ["a.jsonl"]
    assert [b.name for b in inbox.batches()] == ["b.jsonl", "a.jsonl"]
    assert not inbox.quarantine_dir.exists() or not any(inbox.quarantine_dir.iterdir())


def test_a_file_dropped_under_the_name_of_a_claimed_one_waits_its_turn(tmp_path, monkeypatch):
    """Before: a file left claimed (a full disk, a kill) was replaced by the next file dropped
    under its name: the next receive renamed the new ``a.jsonl`` over ``.claimed.a.jsonl``, and the
    first batch was never accepted, quarantined or reported. Now the new file waits a turn."""
    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    write_batch(inbox.root / "a.jsonl", [doc("first", "lava magma crater")])
    ledger_disk_full_once(monkeypatch)
    assert inbox.receive()["accepted"] == [] and (inbox.root / ".claimed.a.jsonl").exists()
    write_batch(inbox.root / "a.jsonl", [doc("second", "basalt flow")])  # a producer that always writes a.jsonl
    assert [inbox.read(b).documents["doc_id"].tolist() for b in inbox.receive()["accepted"]] == [["first"]]
    assert [inbox.read(b).documents["doc_id"].tolist() for b in inbox.receive()["accepted"]] == [["second"]]
    assert [inbox.read(b).documents["doc_id"].tolist() for b in inbox.batches()] == [["first"], ["second"]]


def test_files_that_settle_together_are_accepted_in_the_order_they_were_written(tmp_path):
    """Before: in name order, so ``submit-documents new.jsonl fix.jsonl`` (one tick apart at most)
    accepted the fix first: its edit became an add, and new.jsonl then put back the old text."""
    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    assert main(["submit-documents", str(write_batch(tmp_path / "new.jsonl", [doc("d", "first text")])),
                 "--root", str(tmp_path)]) == 0
    time.sleep(0.01)  # the next submit is dated after it, as a submit a moment later is
    assert main(["submit-documents", str(write_batch(tmp_path / "fix.jsonl", [doc("d", "fixed text")])),
                 "--root", str(tmp_path)]) == 0
    assert [b.name for b in inbox.receive()["accepted"]] == ["new.jsonl", "fix.jsonl"]
    assert [b.name for b in inbox.batches()] == ["new.jsonl", "fix.jsonl"]


def test_a_disk_error_while_quarantining_leaves_no_file_in_quarantine_without_its_reason(tmp_path, monkeypatch):
    """Before: the file was moved to quarantine first and its error written after, so a full disk
    left a refused file with no word of why. Now the error is written first; failing that, the file
    stays claimed and the next receive quarantines it with its reason."""
    import model_code.freshness.inbox as inbox_module

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    inbox.root.mkdir()
    (inbox.root / "a-bad.jsonl").write_text("not json\n")
    write_batch(inbox.root / "b-good.jsonl", [doc("good", "basalt flow")])
    atomic_path, failures = inbox_module.atomic_path, [OSError(28, "No space left on device")]

    def full_once(path):
        if failures and str(path).endswith(".error.json"):
            raise failures.pop()
        return atomic_path(path)

    monkeypatch.setattr(inbox_module, "atomic_path", full_once)
    first = inbox.receive()
    assert ([b.name for b in first["accepted"]], first["quarantined"]) == (["b-good.jsonl"], [])
    assert (inbox.root / ".claimed.a-bad.jsonl").exists()
    assert not inbox.quarantine_dir.exists() or not any(inbox.quarantine_dir.iterdir())
    assert inbox.receive()["quarantined"] == ["a-bad.jsonl"]
    assert sorted(p.name for p in inbox.quarantine_dir.iterdir()) == ["a-bad.jsonl", "a-bad.jsonl.error.json"]
    assert json.loads((inbox.quarantine_dir / "a-bad.jsonl.error.json").read_text())["error"].startswith("a-bad.jsonl:1")


def test_a_file_written_again_while_it_is_accepted_is_kept_for_its_own_turn(tmp_path, monkeypatch):
    """Before: the dropped file was removed by name after validation, so a new batch renamed over
    it meanwhile (the dot-file convention) or lines appended to it were deleted unseen. Now the
    file is claimed (renamed) before it is read: what is written under its name later waits."""
    import model_code.freshness.inbox as inbox_module

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    write_batch(inbox.root / "batch.jsonl", [doc("first", "lava magma crater")])
    read = inbox_module.read_document_batch

    def a_writer_meanwhile(*args, **kwargs):  # during validation: the next batch renamed over the name
        if not (inbox.root / "batch.jsonl").exists():
            write_batch(inbox.root / ".next", [doc("second", "basalt flow")])
            os.rename(inbox.root / ".next", inbox.root / "batch.jsonl")
        return read(*args, **kwargs)

    monkeypatch.setattr(inbox_module, "read_document_batch", a_writer_meanwhile)
    [first] = inbox.receive()["accepted"]
    monkeypatch.setattr(inbox_module, "read_document_batch", read)
    [second] = inbox.receive()["accepted"]
    assert [inbox.read(b).documents["doc_id"].tolist() for b in (first, second)] == [["first"], ["second"]]


def test_a_writer_that_closes_between_lines_loses_nothing(tmp_path):
    """A writer that opens, appends one line and closes, pausing longer than the settle time (the
    documented assumption broken): the inbox may take a prefix, but every line is accepted, in
    order, in one batch or the next, none lost."""
    inbox = Inbox(tmp_path / "inbox", settle_seconds=0.1)
    inbox.root.mkdir()
    for number in range(4):
        with open(inbox.root / "appended.jsonl", "a") as writer:
            writer.write(json.dumps(doc(f"line-{number}", f"lava flow {number}")) + "\n")
        time.sleep(0.3)
        inbox.receive()
    ids = [d for b in inbox.batches() for d in inbox.read(b).documents["doc_id"]]
    assert ids == [f"line-{n}" for n in range(4)]


def test_a_writer_that_opens_the_file_as_it_is_claimed_loses_nothing(tmp_path, monkeypatch):
    """Before: a writer that opened the file after the scan for open writers and before the claim
    kept writing to the claimed file, which was removed once its first lines were accepted."""
    import model_code.freshness.inbox as inbox_module

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    write_batch(inbox.root / "race.jsonl", [doc("line-0", "lava flow 0")])
    rename, writers = os.rename, []

    def opened_just_before(source, target):
        if Path(source).name == "race.jsonl" and not writers:
            writers.append(open(source, "a"))  # noqa: SIM115 - held open across the receive
        rename(source, target)

    monkeypatch.setattr(inbox_module.os, "rename", opened_just_before)
    assert inbox.receive()["accepted"] == []  # held open: not settled
    writers[0].write(json.dumps(doc("line-1", "lava flow 1")) + "\n")
    writers[0].close()
    [batch] = inbox.receive()["accepted"]
    assert inbox.read(batch).documents["doc_id"].tolist() == ["line-0", "line-1"]


def test_a_receive_scans_for_open_writers_twice_however_many_files_wait(tmp_path, monkeypatch):
    """A scan reads every process's file descriptors in ``/proc``: once per claimed file made a
    burst of a thousand small batches cost a thousand scans in one receive."""
    import model_code.freshness.inbox as inbox_module

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    for number in range(5):
        write_batch(inbox.root / f"{number}.jsonl", [doc(f"doc-{number}", f"lava flow {number}")])
    scan, scanned = inbox_module.open_for_writing, []
    monkeypatch.setattr(inbox_module, "open_for_writing", lambda paths: scanned.append(len(paths)) or scan(paths))
    assert len(inbox.receive()["accepted"]) == 5
    assert scanned == [5, 5]  # the settled files, then the claimed ones


def test_an_accepted_batch_is_read_with_the_limits_it_was_accepted_under(tmp_path):
    """Before: lowering data.max_text_chars after a batch was accepted dropped its long document
    from the retrain's corpus and from the update, while both still claimed the batch."""
    from model_code.config import DataParams

    inbox = Inbox(tmp_path / "inbox", settle_seconds=0)
    write_batch(inbox.root / "long.jsonl", [doc("long", "lava " * 400)])  # 2,000 characters
    [batch] = inbox.receive()["accepted"]
    stricter = Inbox(inbox.root, data=DataParams(max_text_chars=1000))
    assert stricter.read(stricter.batch(batch.batch_id)).documents["doc_id"].tolist() == ["long"]


def test_the_incoming_batch_asset_reads_a_batch_as_it_was_accepted(tmp_path, beir_dir, tiny_model_dir):
    """Before: the asset read the accepted file with today's limits, so the drift report and the
    batch's queries lost the long document that the update then applied, and its rejects named
    ``accepted/<id>.jsonl`` instead of the file the user dropped."""
    import dagster as dg
    import yaml

    from assets.incoming import incoming_batch, incoming_batches
    from model_code.layout import Layout
    from orchestration.resources import ParamsResource, WorkspaceResource
    from tests.conftest import tiny_params

    layout = Layout(tmp_path / "ws")
    inbox = Inbox(layout.inbox, settle_seconds=0)
    write_batch(inbox.root / "mine.jsonl", [doc("long", "lava " * 400), {"_id": "", "text": "no id"}])
    [batch] = inbox.receive()["accepted"]
    (layout.root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir,
                                                                        data={"max_text_chars": 1000})))
    resources = {"params": ParamsResource(path=str(layout.root / "params.yaml")),
                 "workspace": WorkspaceResource(root=str(layout.root))}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(incoming_batches.name, [batch.batch_id])
        assert dg.materialize([incoming_batch], partition_key=batch.batch_id, instance=instance,
                              resources=resources).success
    out = layout.incoming_batch(batch.batch_id)
    assert pd.read_parquet(out / "documents.parquet")["doc_id"].tolist() == ["long"]
    [reject] = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert (reject["source"], reject["line"], reject["field"]) == ("mine.jsonl", 2, "doc_id")
