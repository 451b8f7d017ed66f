"""A deployed champion for the freshness loop, fault, serving and endpoint tests: a tiny workspace and
MLflow store built once per session and kind (``deploy``), a sensor tick and an inbox receive as the
daemon would run them, and ``mlflow models serve`` of the champion (``served_champion``)."""

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import dagster as dg
import yaml
from mlflow import MlflowClient

from assets.incoming import batch_queries, champion_update, drift_report, incoming_batch
from model_code.cli import main
from model_code.config import load_params
from model_code.layout import Layout
from orchestration.milvus_lite import free_port
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
from orchestration.sensors import inbox_sensor
from tests.conftest import tiny_params, write_beir
from tracking.registry import register

MODEL = "test-retriever"


def deploy(tmp_path, tiny_model_dir, retriever: str, register_champion: bool = True, index: dict | None = None):
    """A workspace (``tmp_path/workspace``) and MLflow store (``tmp_path/mlflow.db``) where the
    pipeline ran with the bundled MiniLM and, with ``register_champion``, registered v1. Built once
    per session, kind and ``index`` section, then copied: every test gets its own workspace and store
    (new artifacts land beside the template's, under run ids of their own; with ``index.backend:
    milvus`` the copies share the template's collection, each writing write-sets of its own)."""
    settings = f"-{hashlib.sha256(json.dumps(index, sort_keys=True).encode()).hexdigest()[:8]}" if index else ""
    template = tmp_path.parent / f"deployed-{retriever}{settings}-{'registered' if register_champion else 'bare'}"
    if not (template / "done").exists():
        shutil.rmtree(template, ignore_errors=True)
        _build_deployment(template, tiny_model_dir, retriever, register_champion, index or {})
        (template / "done").touch()
    root, uri = tmp_path / "workspace", f"sqlite:///{tmp_path / 'mlflow.db'}"
    shutil.copytree(template / "workspace", root)
    shutil.copy(template / "mlflow.db", tmp_path / "mlflow.db")
    resources = {
        "params": ParamsResource(path=str(root / "params.yaml")),
        "workspace": WorkspaceResource(root=str(root)),
        "mlflow_store": MlflowResource(tracking_uri=uri),
    }
    return root, uri, resources


def drop_templates_on(base: Path, uri: str) -> None:
    """Remove ``deploy``'s templates in ``base`` whose collections were on the Milvus server at
    ``uri``, once that server is stopped: a template is found by its ``index`` section, so a later
    server given the same port would otherwise be handed collections it does not hold."""
    for template in base.glob("deployed-*"):
        params = template / "workspace" / "params.yaml"
        if params.exists() and yaml.safe_load(params.read_text()).get("index", {}).get("milvus", {}).get("uri") == uri:
            shutil.rmtree(template)


def build_workspace(root: Path, beir: Path, tiny_model_dir, retriever: str, index: dict) -> Path:
    """``root``: the pipeline run (``fresh-retriever all``) with the bundled MiniLM, zero-shot,
    on the tiny corpus written to ``beir``; nothing registered."""
    root.mkdir(parents=True)
    params = tiny_params(
        write_beir(beir), tiny_model_dir,
        encoder={"model": "minilm", "max_passage_length": 64},
        train={"enabled": False},
        registry={"min_improvement": 0.5},  # a retrain must beat the champion by 0.5: it will not
        freshness={"min_batch_documents": 5},  # tiny batches: let a 6-document batch's KS count
        retriever={"kind": retriever, "mlr": {"layers": [6, 3]}},  # MiniLM's last layer first (mlr only)
        index=index,
    )
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["all", "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    return root


def _build_deployment(directory: Path, tiny_model_dir, retriever: str, register_champion: bool, index: dict) -> None:
    root = build_workspace(directory / "workspace", directory / "beir", tiny_model_dir, retriever, index)
    if register_champion:
        uri = f"sqlite:///{directory / 'mlflow.db'}"
        assert register(load_params(root / "params.yaml"), Layout(root), tracking_uri=uri)["alias"] == "champion"
    else:  # an empty store
        MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}").search_experiments()


BATCH_RUN = [incoming_batch, batch_queries, drift_report, champion_update]  # the process_incoming_batch job's assets


def tick(sensor, instance, resources, cursor=None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return sensor(context)


def receive(instance, resources) -> list[str]:
    """One inbox-sensor tick, with its dynamic-partition requests applied as the daemon would."""
    result = tick(inbox_sensor, instance, resources)
    if isinstance(result, dg.SkipReason):
        return []
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    assert [r.run_key for r in result.run_requests] == [f"batch:{r.partition_key}" for r in result.run_requests]
    return [r.partition_key for r in result.run_requests]


IN_DOMAIN = [
    {"_id": "astronomy-new", "title": "astronomy comet nebula survey",
     "text": "A note on astronomy: a comet crossed the nebula and the telescope tracked its orbit past the planets."},
    {"_id": "cooking-new", "title": "cooking sourdough",
     "text": "A note on cooking: knead the dough with flour and butter, then bake the sourdough in a hot oven."},
]


def wait_up(server: subprocess.Popen, port: int, log_file, seconds: float = 240) -> None:
    """Until the server at ``port`` answers /ping; its log's tail in the failure if it dies or never does."""
    deadline = time.time() + seconds
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
            return
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                log_file.flush()
                raise AssertionError("mlflow models serve did not come up:\n" + Path(log_file.name).read_text()[-3000:])
            time.sleep(1)


@contextlib.contextmanager
def served_champion(uri: str, log_file):
    """``mlflow models serve`` of the champion; yields ``post(payload) -> (status, body)``."""
    port = free_port()
    bin_dir = os.path.dirname(sys.executable)  # mlflow starts uvicorn from PATH
    mlflow_bin = os.path.join(bin_dir, "mlflow")
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    server = subprocess.Popen(
        [mlflow_bin, "models", "serve", "-m", f"models:/{MODEL}@champion", "--env-manager", "local",
         "-h", "127.0.0.1", "-p", str(port)],
        env=env, stdout=log_file, stderr=subprocess.STDOUT,
    )

    def post(payload: dict) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    try:
        wait_up(server, port, log_file)
        yield post
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:  # on a loaded machine the graceful shutdown can lag
            server.kill()
            server.wait()
