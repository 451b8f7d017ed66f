"""The served model follows the champion (issue 45, item 1): ``fresh-registry serve`` answers a
new version's documents without a restart (a delta replayed in place; for bm25, whose versions are
whole, a version loaded beside and swapped in), follows a rollback (swapped in), fails no request
meanwhile and names the version that answered each one; a server started on a pinned version
stays there. Real ``mlflow models serve``
processes, a real MLflow store, the real update and rollback code."""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from model_code.config import load_params
from model_code.freshness.deployment import apply_batch, rollback
from model_code.layout import Layout
from orchestration.milvus_lite import free_port
from tests.helpers.batches import write_batch
from tests.helpers.deployment import IN_DOMAIN, deploy, wait_up
from tracking.deployment import MlflowRegistry

QUERY = "comet crossing the nebula tracked by a telescope"
NEW = "astronomy-new"


def start_server(root: Path, uri: str, log, *args: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    command = [str(Path(sys.executable).with_name("fresh-registry")), "--params", str(root / "params.yaml"),
               "--root", str(root), "serve", "--port", str(port), *args]
    server = subprocess.Popen(command, env={**os.environ, "MLFLOW_TRACKING_URI": uri}, stdout=log,
                              stderr=subprocess.STDOUT)
    return server, port


def ask(port: int, params: dict) -> dict:
    """The server's answer for QUERY with ``params``."""
    body = json.dumps({"inputs": [QUERY], "params": params}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        [answer] = json.loads(response.read())["predictions"]
    return answer


def search(port: int) -> tuple[str | None, list[str]]:
    """(the version that answered, the top three ids) for QUERY."""
    answer = ask(port, {"k": 3})
    return answer["model_version"], answer["doc_ids"]


def wait_for_version(port: int, version: str, seconds: float = 60) -> tuple[str | None, list[str]]:
    deadline = time.time() + seconds
    while (answer := search(port))[0] != version and time.time() < deadline:
        time.sleep(0.3)
    return answer


# how each kind's update reaches a following server: bm25 versions are stored whole (no deltas)
IN_PLACE, SWAPPED = "replayed 1 update(s) in place, now v2", "v2 loaded beside v1 and swapped in"
# on Milvus the update is served from its commit row, before its version is registered, when the server polls in between
COMMITTED = "replayed committed update v0001 in place, now v1+v0001"
UPDATE_SEEN_AS = {"dense": IN_PLACE, "incdsi": IN_PLACE, "mlr": IN_PLACE, "svdr": IN_PLACE, "bm25": SWAPPED,
                  "dense-on-milvus": IN_PLACE,  # the kind on a loopback Milvus Lite server's collection
                  "svdr-on-milvus": IN_PLACE}


# incdsi, mlr and svdr on the default backend (FAISS, svdr's CSR store) replay their deltas as the
# conformance suite checks in process (tests/conformance/test_retriever_contract.py), and the server's
# following is kind-independent, so their server runs are in the slow tier; so is dense on Milvus, whose
# endpoint following a collection test_milvus_loop's Lite case checks in the fast tier, and bm25, whose
# update is a whole version swapped in as every kind's rollback is (dense's rollback checks the swap here).
# dense and svdr on Milvus stay here
SLOW_TIER = {"incdsi", "mlr", "svdr", "dense-on-milvus", "bm25"}


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=pytest.mark.slow) if kind in SLOW_TIER else kind
                                  for kind in UPDATE_SEEN_AS])
def test_a_following_server_serves_each_champion_without_a_restart_and_a_pinned_one_stays(tmp_path, tiny_model_dir,
                                                                                         kind, request):
    index = None
    if kind.endswith("-on-milvus"):  # the update (this process) and the server write and read one server's collection
        kind, index = kind.removesuffix("-on-milvus"), {"backend": "milvus",
                                                        "milvus": {"uri": request.getfixturevalue("milvus_server")}}
    root, uri, _ = deploy(tmp_path, tiny_model_dir, kind, index=index)
    params, layout = load_params(root / "params.yaml"), Layout(root)
    registry = MlflowRegistry(params, layout, uri)
    names = ("following", "pinned") if kind == "dense" else ("following",)  # pinning is the same for every kind
    logs = {name: tmp_path / f"{name}.log" for name in names}
    files = {name: path.open("w") for name, path in logs.items()}
    servers = {"following": start_server(root, uri, files["following"])}
    if kind == "dense":
        servers["pinned"] = start_server(root, uri, files["pinned"], "--version", "1")
    answers, failures, stop = [], [], threading.Event()
    try:
        for name, (server, port) in servers.items():
            wait_up(server, port, files[name])
        following = servers["following"][1]
        assert search(following)[0] == "1" and NEW not in search(following)[1]

        def clients():  # steady requests, through the update and the rollback
            while not stop.is_set():
                try:
                    answers.append(search(following))
                except OSError as error:
                    failures.append(repr(error))
                stop.wait(0.05)  # about 20 a second: steady traffic, not a busy loop the other tests' cores pay for

        load = threading.Thread(target=clients)
        load.start()
        write_batch(tmp_path / "b1.jsonl", IN_DOMAIN)
        assert apply_batch(registry, params, layout, tmp_path / "b1.jsonl")["registered_version"] == 2
        version, top = wait_for_version(following, "2")
        assert (version, top[0]) == ("2", NEW)  # the new document, no restart
        if kind == "dense":
            pinned_version, pinned_top = search(servers["pinned"][1])
            assert pinned_version == "1" and NEW not in pinned_top

        rollback(registry, layout)  # the champion back to v1: followed too
        version, top = wait_for_version(following, "1")
        assert version == "1" and NEW not in top
        stop.set()
        load.join()
    finally:
        stop.set()
        for server, _ in servers.values():
            server.terminate()
            server.wait(timeout=60)
        for file in files.values():
            file.close()
    assert not failures and len(answers) > 10
    with_new = {"2", "1+v0001"} if index else {"2"}
    assert all((NEW in ids) == (version in with_new) for version, ids in answers)  # each from one version whole
    following_log = logs["following"].read_text()
    if index:  # the commit row or the registered version, whichever the server saw first
        assert IN_PLACE in following_log or COMMITTED in following_log
    else:  # a delta replayed in place, or a whole version swapped in
        assert (SWAPPED if kind == "bm25" else IN_PLACE) in following_log
    assert "v1 loaded beside v2 and swapped in" in following_log  # the rollback: a reload beside
    if kind == "dense":
        assert "(pinned)" in logs["pinned"].read_text() and "swapped" not in logs["pinned"].read_text()
    if index:
        assert_the_update_is_a_view_of_the_champions_collection(registry, index["milvus"]["uri"])


def assert_the_update_is_a_view_of_the_champions_collection(registry: MlflowRegistry, milvus_uri: str) -> None:
    """v2 names v1's collection and stores the write-set it added (no vectors, no index file); the
    Milvus alias followed the champion's collection."""
    import mlflow
    from pymilvus import MilvusClient

    collection = registry.version("1").tags["index_collection"]
    assert registry.version("2").tags["index_collection"] == collection
    stored = Path(mlflow.artifacts.download_artifacts(artifact_uri=registry.artifact_uri("2", "retriever")))
    index_files = {p.name for p in (stored / "index_delta").iterdir()}
    assert index_files == {"milvus_delta.json", "store.json"}
    [write_set] = json.loads((stored / "index_delta" / "milvus_delta.json").read_text())["write_sets"]
    rows = MilvusClient(uri=milvus_uri).query(collection, filter=f"born == {write_set}", output_fields=["doc_id"])
    assert sorted(r["doc_id"] for r in rows) == sorted(d["_id"] for d in IN_DOMAIN)
    assert MilvusClient(uri=milvus_uri).describe_alias("test_retriever_champion")["collection_name"] == collection


def test_the_pyfunc_loads_outside_a_logged_model_as_mlflow_does_for_its_input_example(tmp_path, tiny_model_dir,
                                                                                      monkeypatch):
    """While a version is logged, MLflow runs its input example with the artifacts where they were
    written, not inside a model directory: the lookup of the served version must not fail there
    (it did, so every version was logged without a checked example)."""
    from types import SimpleNamespace

    from tracking.following import MODEL_ENV
    from tracking.pyfunc import RetrieverModel

    root, _, _ = deploy(tmp_path, tiny_model_dir, "dense")
    layout = Layout(root)
    serve = tmp_path / "serve.json"
    serve.write_text(load_params(root / "params.yaml").serve.model_dump_json())
    monkeypatch.setenv(MODEL_ENV, "test-retriever")  # as under fresh-registry serve
    model = RetrieverModel()
    model.load_context(SimpleNamespace(artifacts={"retriever": str(layout.retriever), "encoder": str(layout.encoder),
                                                  "serve": str(serve)}))
    answer = model.predict(None, [QUERY], {"k": 3})
    assert answer["model_version"].tolist() == [None] and len(answer["doc_ids"][0]) == 3


def test_a_search_returns_the_documents_as_the_answering_version_holds_them(tmp_path, tiny_model_dir):
    """``return: documents``: an accepted document's text, an edit's new text, no removed document,
    each as the version that answered holds it (expected text from the source and batch files)."""
    root, uri, _ = deploy(tmp_path, tiny_model_dir, "dense")
    params, layout = load_params(root / "params.yaml"), Layout(root)
    registry = MlflowRegistry(params, layout, uri)
    corpus = Path(params.data.path) / "corpus.jsonl"
    expected = {row["_id"]: (row["title"], row["text"]) for row in map(json.loads, corpus.read_text().splitlines())}
    edited = {"_id": NEW, "title": "astronomy comet", "text": "An edited note: the comet crossed the nebula again."}
    removed = "astronomy-1"
    with (tmp_path / "server.log").open("w") as log:
        server, port = start_server(root, uri, log)
        try:
            wait_up(server, port, log)
            everything = {"k": len(expected) + 5, "return": "documents"}

            def check(version: str, documents: dict) -> list[str]:
                answer = ask(port, everything)
                assert answer["model_version"] == version
                assert [d["doc_id"] for d in answer["documents"]] == answer["doc_ids"]
                assert {d["doc_id"]: (d["title"], d["text"]) for d in answer["documents"]} == documents
                return answer["doc_ids"]

            check("1", expected)
            write_batch(tmp_path / "b1.jsonl", IN_DOMAIN)
            apply_batch(registry, params, layout, tmp_path / "b1.jsonl")
            wait_for_version(port, "2")
            expected.update({d["_id"]: (d["title"], d["text"]) for d in IN_DOMAIN})
            check("2", expected)

            write_batch(tmp_path / "b2.jsonl", [edited, {"_id": removed, "deleted": True}])
            apply_batch(registry, params, layout, tmp_path / "b2.jsonl")
            wait_for_version(port, "3")
            expected[NEW] = (edited["title"], edited["text"])
            del expected[removed]
            assert removed not in check("3", expected)
            assert "documents" not in ask(port, {"k": 3})  # ids only unless asked
        finally:
            server.terminate()
            server.wait(timeout=60)


def test_each_request_is_checked_against_the_limits_of_the_version_that_answers_it(tmp_path, tiny_model_dir,
                                                                                  monkeypatch):
    """Before: a server checked every request against the limits (``serve.max_k``, ``max_queries``)
    of the version it first loaded, so an update or a retrain logged with other limits was served
    with the old ones until a restart. Here v2, an update logged with ``max_k: 2``, is replayed in
    place and refuses k = 3; the rollback swaps v1 back in, which takes it again."""
    import mlflow
    import yaml
    from mlflow.exceptions import MlflowException

    from tracking.following import FOLLOW_ENV, MODEL_ENV

    root, uri, _ = deploy(tmp_path, tiny_model_dir, "dense")
    use_tracking(monkeypatch, uri)
    monkeypatch.setenv(MODEL_ENV, "test-retriever")  # as under fresh-registry serve, stepped by hand (no thread)
    monkeypatch.delenv(FOLLOW_ENV, raising=False)
    model = mlflow.pyfunc.load_model("models:/test-retriever/1").unwrap_python_model()
    assert len(model.predict(None, [QUERY], {"k": 3})["doc_ids"][0]) == 3

    settings = yaml.safe_load((root / "params.yaml").read_text())
    settings["serve"] = {**settings.get("serve", {}), "max_k": 2}
    (root / "params.yaml").write_text(yaml.safe_dump(settings))
    params, layout = load_params(root / "params.yaml"), Layout(root)
    registry = MlflowRegistry(params, layout, uri)
    write_batch(tmp_path / "b1.jsonl", IN_DOMAIN)
    assert apply_batch(registry, params, layout, tmp_path / "b1.jsonl")["registered_version"] == 2
    v1 = model.served
    assert model.catch_up("test-retriever", "champion") == "2" and model.served is v1  # replayed in place
    with pytest.raises(MlflowException, match=r"params.k: must be an integer in 1\.\.2 \(serve.max_k\)"):
        model.predict(None, [QUERY], {"k": 3})
    assert len(model.predict(None, [QUERY], {"k": 2})["doc_ids"][0]) == 2

    rollback(registry, layout)
    assert model.catch_up("test-retriever", "champion") == "1" and model.served is not v1  # loaded beside, swapped in
    assert len(model.predict(None, [QUERY], {"k": 3})["doc_ids"][0]) == 3


def test_a_version_is_searched_once_before_it_answers():
    """The first search pays a retriever's lazy set-up (1.9 s at a server's start): the served
    version takes it when it is loaded, at a start or beside the one it replaces, not a client."""
    from model_code.config import ServeParams
    from tracking.following import WARM_UP_QUERY, ServedVersion

    class Recording:
        def __init__(self):
            self.calls = []

        def search(self, queries, k, desc=None):
            self.calls.append((queries, k))
            return []

    retriever = Recording()
    served = ServedVersion.of((retriever, None), "3", {"lineage_root": "1", "retriever_version": "v0002"}, ServeParams())
    assert retriever.calls == [([WARM_UP_QUERY], 1)]
    assert (served.version, served.lineage, served.retriever_version) == ("3", "1", "v0002")


def test_a_commit_is_another_deployments_only_when_the_store_says_its_run_does_not_exist(mlflow_uri, monkeypatch):
    """A store unreachable for a moment must fail the poll (the next one reads again), not make
    a served commit look like another deployment's."""
    from types import SimpleNamespace

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    from tracking.following import logged_here

    use_tracking(monkeypatch, mlflow_uri)
    run_id = MlflowClient().create_run(MlflowClient().create_experiment("e")).info.run_id
    assert logged_here(SimpleNamespace(run_id=run_id))
    assert not logged_here(SimpleNamespace(run_id="f" * 32))  # the store's own answer: no such run

    def unavailable(self, run_id):
        raise MlflowException("the tracking server is restarting", error_code=TEMPORARILY_UNAVAILABLE)

    monkeypatch.setattr(MlflowClient, "get_run", unavailable)
    with pytest.raises(MlflowException, match="restarting"):
        logged_here(SimpleNamespace(run_id=run_id))


def use_tracking(monkeypatch, uri: str) -> None:
    """This process's MLflow on ``uri`` for one test, then back: an earlier test in the same worker
    may have called ``mlflow.set_tracking_uri``, which the environment variable does not override."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", uri)


def test_a_retrain_on_a_new_milvus_server_is_followed_while_the_retired_one_is_down(mlflow_uri, monkeypatch):
    """Before: each poll read the served lineage's commit log before comparing the alias, so once
    the old lineage's Milvus server was retired (the retrain's collection on a new one) every poll
    failed there and the server kept answering from the old version for ever."""
    from mlflow import MlflowClient

    from model_code.config import ServeParams
    from model_code.stores.milvus_commits import CommitLog
    from tracking import following
    from tracking.following import Follower, ServedVersion

    class Recording:
        def search(self, queries, k, desc=None):
            return []

    use_tracking(monkeypatch, mlflow_uri)
    client = MlflowClient()
    client.create_registered_model("m")
    client.create_model_version("m", source="file:///nowhere", tags={  # the served lineage, on the old server
        "index_uri": "http://127.0.0.1:9", "index_collection": "retired"})
    client.create_model_version("m", source="file:///nowhere")  # a retrain: a lineage of its own
    client.set_registered_model_alias("m", "champion", "2")

    def retired(self):
        raise ConnectionError("the old lineage's Milvus server is gone")

    monkeypatch.setattr(CommitLog, "read", retired)
    monkeypatch.setattr(following, "download", lambda model_uri, scratch: {"model": model_uri})
    loaded = []
    served = ServedVersion.of((Recording(), None), "1", {}, ServeParams())
    follower = Follower("m", "champion", served,
                        lambda artifacts, scratch: loaded.append(artifacts) or (Recording(), None), 1)
    assert follower.follow_once()
    assert (follower.served.version, loaded) == ("2", [{"model": "models:/m/2"}])


def test_what_a_swap_downloads_from_a_remote_store_goes_with_the_version(tmp_path, monkeypatch):
    """Before: each swap downloaded the version (and its lineage's encoder) from a remote artifact
    store into folders nothing removed: a server following retrains filled its disk. Now a
    version's downloads lie in a folder of its own, removed once nothing serves from it. A real
    ``mlflow server`` proxies the artifacts (``mlflow-artifacts:`` URIs)."""
    import gc
    import tempfile as tempfile_module
    import urllib.request

    import mlflow
    from mlflow import MlflowClient

    from tests.helpers.waiting import wait_until
    from tracking.following import Follower, ServedVersion
    from tracking.pyfunc import encoder_path

    class Recording:
        def search(self, queries, k, desc=None):
            return []

    class Files(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input):
            return model_input

    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--artifacts-destination",
                               str(tmp_path / "stored"), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def health():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                return False

        wait_until(health, "the MLflow server", 120)
        use_tracking(monkeypatch, f"http://127.0.0.1:{port}")
        experiment = MlflowClient().create_experiment("swaps")
        monkeypatch.setattr(tempfile_module, "tempdir", str(tmp_path / "tmp"))  # MLflow's own folders land here too
        (tmp_path / "tmp").mkdir()
        (tmp_path / "weights").mkdir()
        (tmp_path / "weights" / "encoder.bin").write_bytes(b"\0" * 1000)
        for _ in range(2):
            with mlflow.start_run(experiment_id=experiment):  # not the experiment an earlier test made active
                mlflow.log_artifacts(str(tmp_path / "weights"), artifact_path="encoder")
                encoder_uri = f"{mlflow.get_artifact_uri()}/encoder"  # what an update's encoder_ref holds
                (tmp_path / "encoder_ref.json").write_text(json.dumps({"encoder_uri": encoder_uri}))
                mlflow.pyfunc.log_model(name="retriever", python_model=Files(), registered_model_name="m",
                                        pip_requirements=["mlflow"],  # not inferred: that loads the model again
                                        artifacts={"encoder_ref": str(tmp_path / "encoder_ref.json")})
        assert encoder_uri.startswith("mlflow-artifacts:")  # a remote store: every read is a download
        MlflowClient().set_registered_model_alias("m", "champion", "2")

        folders = []

        def load(artifacts, scratch):
            folders.append(scratch)
            assert Path(encoder_path(artifacts, scratch)).is_relative_to(scratch)  # the encoder lands there too
            return Recording(), None

        first = ServedVersion.loaded(load, "models:/m/1", "1", {})
        follower = Follower("m", "champion", first, load, 1)
        del first
        assert follower.follow_once() and follower.served.version == "2"
        in_flight = follower.served  # a request still answering from v2 while v1 comes back
        MlflowClient().set_registered_model_alias("m", "champion", "1")
        assert follower.follow_once() and follower.served.version == "1"
        gc.collect()
        assert [folder.is_dir() for folder in folders] == [False, True, True]  # v1's first load went with it
        assert any(folders[1].iterdir())  # its downloads
        del in_flight
        gc.collect()
        assert [folder.is_dir() for folder in folders] == [False, False, True]
        assert sorted(p.name for p in (tmp_path / "tmp").iterdir()) == [folders[2].name]  # nothing else left behind
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
