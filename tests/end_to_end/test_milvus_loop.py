"""The freshness loop end to end with ``index.backend: milvus`` on a loopback Milvus server:
a batch dropped into the inbox is picked up by the inbox sensor, its Dagster run (validate,
queries, drift report, update) writes it into the champion's collection and registers the
version, and an HTTP endpoint started before (``mlflow models serve`` following ``champion``, a
second process reading the same server) answers with the new document, no restart."""

import json
import time

import dagster as dg
import pytest

from model_code.config import load_params
from model_code.layout import Layout
from tests.helpers.batches import write_batch
from tests.helpers.deployment import BATCH_RUN, IN_DOMAIN, deploy, receive, served_champion
from tracking.deployment import MlflowRegistry
from tracking.following import FOLLOW_ENV, MODEL_ENV, REFRESH_ENV


# the loop on the standalone server is the Lite variant's code path against another server (whose store-level
# behaviour test_milvus_store checks in the fast tier): about 80-130 s of a 2-core CI run, so the slow tier
@pytest.mark.parametrize("engine", ["lite", pytest.param("standalone", marks=pytest.mark.slow)])
def test_a_batch_reaches_a_running_endpoint_through_the_champions_collection(tmp_path, tiny_model_dir, engine,
                                                                            request, monkeypatch):
    """On the loopback Milvus Lite server and on a Milvus server (2.3 standalone)."""
    server = request.getfixturevalue("milvus_server" if engine == "lite" else "milvus_standalone")
    index = {"backend": "milvus", "milvus": {"uri": server}}
    root, uri, resources = deploy(tmp_path, tiny_model_dir, "dense", index=index)
    params = load_params(root / "params.yaml")
    registry = MlflowRegistry(params, Layout(root), uri)
    for name, value in ((MODEL_ENV, params.registry.model_name), (FOLLOW_ENV, "champion"), (REFRESH_ENV, "0.5")):
        monkeypatch.setenv(name, value)  # the served model follows the champion, as `fresh-registry serve` sets it
    query = {"inputs": ["comet crossing the nebula tracked by a telescope"], "params": {"k": 3}}
    with open(tmp_path / "serve.log", "w") as log, served_champion(uri, log) as post, \
            dg.instance_for_test() as instance:
        status, body = post(query)
        assert status == 200 and "astronomy-new" not in json.loads(body)["predictions"][0]["doc_ids"]

        write_batch(root / "inbox" / "b1.jsonl", IN_DOMAIN)
        [key] = receive(instance, resources)
        assert dg.materialize(BATCH_RUN, partition_key=key, instance=instance, resources=resources).success
        champion = registry.champion()
        assert champion.version == "2" and champion.tags["index_collection"] == registry.version("1").tags[
            "index_collection"]  # the batch went into the lineage's collection, not a new one

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = post(query)
            [answer] = json.loads(body)["predictions"]
            if answer["model_version"] == "2":
                break
            time.sleep(0.3)
        assert status == 200 and (answer["model_version"], answer["doc_ids"][0]) == ("2", "astronomy-new")
    served_log = (tmp_path / "serve.log").read_text()  # from the commit row, or the version if registered first
    if not ("replayed 1 update(s) in place, now v2" in served_log
            or "replayed committed update v0001 in place, now v1+v0001" in served_log):
        pytest.fail("the endpoint did not follow the update in place:\n" + served_log[-3000:])
