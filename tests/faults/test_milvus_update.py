"""An update on ``index.backend: milvus`` killed (-9) between its collection write and its registry
write: the champion serves exactly what it served before (the killed update's rows are in the
collection, under a write-set no version lists); the batch applied again is served once; ``fresh-registry
gc`` deletes the killed update's rows and nothing a registered version lists."""

import json
import subprocess
import sys

import mlflow
from pymilvus import MilvusClient

from model_code.config import load_params
from model_code.freshness.deployment import apply_batch
from model_code.layout import Layout
from tests.conftest import REPOSITORY
from tests.helpers.batches import write_batch
from tests.helpers.deployment import IN_DOMAIN, MODEL, deploy
from tracking.collections import collect_garbage
from tracking.deployment import MlflowRegistry

KILLED_DURING_REGISTRATION = """
import os, signal, sys
from pathlib import Path
import tracking.deployment
from model_code.config import load_params
from model_code.freshness.deployment import apply_batch
from model_code.layout import Layout
from tracking.deployment import MlflowRegistry

def killed(*args, **kwargs):  # the retriever version is committed and its rows written; the registry not yet
    os.kill(os.getpid(), signal.SIGKILL)

tracking.deployment.log_retriever = killed
root, uri, batch = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
params, layout = load_params(root / "params.yaml"), Layout(root)
apply_batch(MlflowRegistry(params, layout, uri), params, layout, batch)
"""


def served(uri: str) -> set[str]:
    mlflow.set_tracking_uri(uri)
    return set(mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").unwrap_python_model().retriever.live_ids())


def test_a_kill_between_the_collection_write_and_the_registry_write_serves_nothing_half_applied(
        tmp_path, tiny_model_dir, milvus_server):
    index = {"backend": "milvus", "milvus": {"uri": milvus_server, "collection_prefix": "killed_update"}}
    root, uri, _ = deploy(tmp_path, tiny_model_dir, "dense", index=index)
    params, layout = load_params(root / "params.yaml"), Layout(root)
    registry = MlflowRegistry(params, layout, uri)
    before = served(uri)
    batch = write_batch(tmp_path / "b1.jsonl", IN_DOMAIN)
    new = {d["_id"] for d in IN_DOMAIN}

    killed = subprocess.run([sys.executable, "-c", KILLED_DURING_REGISTRATION, str(root), uri, str(batch)],
                            cwd=REPOSITORY, capture_output=True, text=True, check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
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
