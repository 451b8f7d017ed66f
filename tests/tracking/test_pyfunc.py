"""The search endpoint's bad requests, through ``mlflow models serve``: each is answered 400 with
the endpoint's own message naming the field, never a stack trace, a path or more than a short
prefix of what was sent. One model (a tiny dense retriever) is served for the whole module."""

import json
import re
import shutil
import urllib.error
import urllib.request
from types import SimpleNamespace

import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from model_code.config import load_params
from tests.conftest import run_stages, tiny_params, write_beir
from tests.helpers.deployment import MODEL, served_champion
from tracking.pyfunc import log_retriever

LONG = "x" * 50_000


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir, empty_mlflow_store):
    """The champion served over HTTP: ``post(payload)`` and ``send(body_bytes, content_type)`` to
    it (each returns ``(status, body)``), its ``uri`` and ``model_uri``, and ``base``, the folder
    holding its workspace and artifact store (a path that must never appear in an answer)."""
    base = tmp_path_factory.mktemp("endpoint")
    root = base / "workspace"
    params = tiny_params(write_beir(base / "beir"), tiny_model_dir, train={"enabled": False})
    layout = run_stages(root, params, "ingest", "train", "index")
    shutil.copy(empty_mlflow_store, base / "mlflow.db")
    uri = f"sqlite:///{base / 'mlflow.db'}"
    client, previous = MlflowClient(uri), mlflow.get_tracking_uri()
    experiment = client.create_experiment("endpoint", artifact_location=(base / "artifacts").as_uri())
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run(experiment_id=experiment):
            info = log_retriever(layout.encoder, layout.retriever, load_params(root / "params.yaml").serve)
        version = mlflow.register_model(info.model_uri, MODEL).version
    finally:
        mlflow.set_tracking_uri(previous)
    client.set_registered_model_alias(MODEL, "champion", version)
    with open(base / "serve.log", "w") as log_file, served_champion(uri, log_file) as post:
        port = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", (base / "serve.log").read_text())[1]

        def send(body: bytes, content_type: str) -> tuple[int, str]:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                             headers={"Content-Type": content_type})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as error:
                return error.code, error.read().decode()

        yield SimpleNamespace(post=post, send=send, base=base, uri=uri, model_uri=info.model_uri)


def assert_rejected(answer: tuple[int, str], base, *named: str) -> str:
    """A 400 whose message names each of ``named`` and whose body holds no stack trace, no path
    and at most a short prefix of the request; returns the message."""
    status, body = answer
    assert status == 400, (status, body[:500])
    assert len(body) < 600, body[:500]
    for leak in ("stack_trace", "Traceback", "site-packages", str(base)):
        assert leak not in body, body
    message = json.loads(body)["message"]
    assert all(name in message for name in named), message
    return message


def test_a_lone_surrogate_in_a_query_is_rejected_naming_the_query(served):
    post, base = served.post, served.base
    answer = post({"inputs": ["ok", "ab\ud800c"]})
    message = assert_rejected(answer, base, "inputs[1]", "not encodable text (lone surrogate at position 2)")
    assert "Failed to predict" not in message  # the scoring server's wrapper, which quotes the request


def test_unknown_params_are_rejected_naming_the_key_and_the_known_ones(served):
    post, base = served.post, served.base
    assert_rejected(post({"inputs": ["ok"], "params": {"kk": 5}}), base, "params", "'kk'", "known: k, return")
    assert_rejected(post({"inputs": ["ok"], "params": {"k": 2, LONG: 1}}), base, "params", "'xxxxxxxx")
    status, body = post({"inputs": ["ok"], "params": {"k": 2}})
    assert status == 200 and len(json.loads(body)["predictions"][0]["doc_ids"]) == 2


def test_a_body_with_two_inputs_or_unknown_fields_is_rejected(served):
    post, base = served.post, served.base
    assert_rejected(post({"inputs": ["ok"], "instances": ["other"]}), base, "'instances'", "ambiguous")
    assert_rejected(post({"inputs": ["ok"], "dataframe_records": [{"q": "x"}]}), base, "'dataframe_records'")
    assert_rejected(post({"inputs": ["ok"], "k": 5}), base, "'k'", "inputs", "params")


def test_an_answer_quotes_at_most_a_short_prefix_of_the_request(served):
    post, base = served.post, served.base
    assert_rejected(post({"inputs": ["q" * 5] * 10_000}), base, "inputs", "serve.max_queries")
    assert_rejected(post({"inputs": [LONG, 42]}), base, "inputs[1]", "Expected type str, but got int")
    assert_rejected(post({"inputs": [LONG], "params": {"k": "9" * 50_000}}), base, "params.k")
    assert_rejected(post({LONG: 1}), base, "'xxxxxxxx")


def test_a_body_that_is_not_a_json_request_is_rejected(served):
    """Malformed JSON (MLflow's parser quoted it whole), JSON nested past Python's recursion limit
    (a 500) and CSV (a parse error carried a stack trace; a number column became queries)."""
    send, base = served.send, served.base
    assert_rejected(send(b'{"inputs": ["' + LONG.encode(), "application/json"), base, "body", "JSON")
    assert_rejected(send(b'{"inputs": ' + b"[" * 100_000, "application/json"), base, "body", "JSON")
    assert_rejected(send(b'{"inputs": ["\xff' + LONG.encode(), "application/json"), base, "body")
    for body in (b'query\n"unterminated ' + LONG.encode(), b"query\n42\n"):
        status, answer = send(body, "text/csv")
        assert status == 415 and "application/json" in answer and len(answer) < 600, (status, answer[:500])


def test_the_pyfunc_rejects_a_lone_surrogate_naming_the_query(served):
    """Called in process (``fresh-registry search``, a notebook), not only over HTTP."""
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(served.uri)
    try:
        model = mlflow.pyfunc.load_model(served.model_uri)
    finally:
        mlflow.set_tracking_uri(previous)
    with pytest.raises(MlflowException, match=r"inputs\[0\]: .*lone surrogate at position 0"):
        model.predict(["\udfff"], params={"k": 2})
