"""The freshness loop against the production stack (``orchestration/stack.py``; ``make test-stack``,
not part of ``make test``): Dagster's daemon on PostgreSQL storage, the MLflow tracking server on
PostgreSQL with proxied artifacts, the index in a Milvus Lite server, and a following endpoint.
Batches go through the inbox one after another, each meeting a fault: none; PostgreSQL restarted
before it; every Dagster process killed (-9) while its update registers, then the daemon restarted;
the MLflow server down while it is applied. After each, the inbox ledger, the registry and what
the endpoint answers agree: every accepted batch served once, in ledger order."""

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from model_code.config import load_params
from model_code.freshness.deployment import served_batches
from model_code.freshness.inbox import Inbox
from model_code.layout import Layout
from orchestration.milvus_lite import free_port
from orchestration.stack import (
    Ports,
    Stack,
    down,
    running,
    start_daemon,
    start_mlflow,
    start_postgres,
    stop_postgres,
    stop_process,
    up_dagster,
    up_stores,
    wait_http,
)
from tests.helpers.batches import write_batch
from tests.helpers.deployment import MODEL, build_workspace, served_champion
from tests.helpers.waiting import wait_until
from tracking.deployment import MlflowRegistry
from tracking.following import FOLLOW_ENV, MODEL_ENV, REFRESH_ENV
from tracking.registry import register

pytestmark = pytest.mark.stack


@pytest.fixture
def stack(tmp_path):
    """A stack of this test's own on free ports, its daemon loading the fault-test code location
    (the project's Definitions plus a hold inside an update's registration); stopped at the end,
    leaving no process behind. Its folder is one the postgres user can enter (pytest's is root's)."""
    base = Path(tempfile.mkdtemp(prefix="fresh-stack-"))
    base.chmod(0o755)
    stack = Stack(base, tmp_path / "workspace", Ports(*(free_port() for _ in range(4))),
                  definitions="tests.faults.fault_location", monitoring_poll_s=2)
    try:
        up_stores(stack)
        yield stack
    finally:
        down(stack)
        assert not any(running(stack, name) for name in ("mlflow", "dagster-daemon", "dagster-webserver"))
        shutil.copytree(base, tmp_path / "stack-logs", ignore=shutil.ignore_patterns("postgres", "milvus*",
                                                                                       "mlflow-artifacts"))
        shutil.rmtree(base)


def document(n: int) -> dict:
    word = ["zebra", "quasar", "marmalade", "obsidian"][n]
    return {"_id": f"stack-{n}", "title": f"{word} report",
            "text": f"The {word} {word} protocol: everything about the {word} and nothing else, {word} again."}


def test_batches_through_the_stack_are_served_once_in_order_through_its_faults(stack, tmp_path, tiny_model_dir,
                                                                                monkeypatch):
    index = {"backend": "milvus", "milvus": {"uri": f"http://127.0.0.1:{stack.ports.milvus}"}}
    root = build_workspace(stack.workspace, tmp_path / "beir", tiny_model_dir, "dense", index)
    params, layout = load_params(root / "params.yaml"), Layout(root)
    assert register(params, layout, tracking_uri=stack.tracking_uri)["alias"] == "champion"
    hold = tmp_path / "hold"
    monkeypatch.setenv("FRESH_TEST_HOLD_FILE", str(hold))  # the daemon inherits it (tests/faults/fault_location.py)
    up_dagster(stack, webserver=False)
    registry = MlflowRegistry(params, layout, stack.tracking_uri)
    for name, value in ((MODEL_ENV, MODEL), (FOLLOW_ENV, "champion"), (REFRESH_ENV, "0.5")):
        monkeypatch.setenv(name, value)

    with open(tmp_path / "serve.log", "w") as log, served_champion(stack.tracking_uri, log) as post:
        def top(n: int) -> str | None:
            status, body = post({"inputs": [document(n)["text"]], "params": {"k": 1}})
            assert status == 200, body  # the endpoint answers through every fault
            return json.loads(body)["predictions"][0]["doc_ids"][0]

        def daemon_log() -> str:
            return (stack.base / "dagster-daemon.log").read_text(errors="replace")[-3000:]

        def submit_and_wait(n: int, what: str) -> None:
            write_batch(root / "inbox" / f"b{n}.jsonl", [document(n)])
            wait_until(lambda: top(n) == f"stack-{n}", f"batch {n} ({what}) served", 600, 1.0, daemon_log)
            assert_ledger_registry_and_endpoint_agree(n)

        def assert_ledger_registry_and_endpoint_agree(n: int) -> None:
            ledger = [b.batch_id for b in Inbox(layout.inbox).included()]
            # on Milvus a commit is served before its version registers (seconds later): the registry then
            wait_until(lambda: len(served_batches(registry, registry.champion())) == len(ledger),
                       f"batch {n} registered", 120, 1.0, daemon_log)
            assert list(served_batches(registry, registry.champion())) == ledger  # once each, in ledger order
            assert len(ledger) == n + 1
            assert all(top(i) == f"stack-{i}" for i in range(n + 1))

        submit_and_wait(0, "no fault")

        stop_postgres(stack)  # PostgreSQL restarted between two batches
        start_postgres(stack)
        submit_and_wait(1, "after a PostgreSQL restart")

        hold.touch()  # every Dagster process killed while the update registers, the daemon restarted
        write_batch(root / "inbox" / "b2.jsonl", [document(2)])
        wait_until((tmp_path / "reached").exists, "the update to reach its registration", 600, 0.5)
        stop_process(stack, "dagster-daemon", crash=True)
        hold.unlink()
        start_daemon(stack)
        wait_until(lambda: top(2) == "stack-2", "the crashed batch served after the restart", 600, 1.0, daemon_log)
        assert_ledger_registry_and_endpoint_agree(2)

        stop_process(stack, "mlflow")  # the MLflow server down while the batch is applied
        write_batch(root / "inbox" / "b3.jsonl", [document(3)])
        time.sleep(15)
        assert top(0) == "stack-0"  # the endpoint keeps serving the champion it has
        start_mlflow(stack)
        wait_http(f"{stack.tracking_uri}/health", "the MLflow server", stack.base / "mlflow.log")
        wait_until(lambda: top(3) == "stack-3", "the batch applied once MLflow is back", 600, 1.0, daemon_log)
        assert_ledger_registry_and_endpoint_agree(3)
