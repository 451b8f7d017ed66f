"""The retriever as an MLflow pyfunc: any registered retriever kind, served as one model.

Artifacts: ``retriever`` (a saved retriever directory, whose manifest names its kind) and, for
kinds that use one, the encoder: either a copy (``encoder``, what a full training logs) or
``encoder_ref``, a small JSON file holding the artifact URI of the encoder its lineage's full
training logged (what an incremental update logs: updates keep the encoder, so each one would
otherwise store another copy of the same weights). An update's ``retriever`` may hold only what it
changed (a delta); then ``retriever_chain`` lists the artifact URIs of the retrievers it is applied
to, a whole copy first, and loading replays them in order.

``predict`` takes query strings (a list, or a DataFrame whose first or ``query`` column holds them)
and returns one row per query with the ranked ``doc_ids``, their ``scores`` and the
``model_version`` that answered (None for a model loaded outside ``fresh-registry serve``); the
``k`` param sets the depth, and ``return: documents`` adds ``documents``: each hit's ``doc_id``,
``title`` and ``text`` as the answering version holds them (``versions.documents``: the
ingested corpus with the accepted batches' additions, edits and removals applied).
``checked_request`` validates a request: a bad one (an unknown body field or param,
no queries, a query that is not a non-empty string of encodable text, more than
``serve.max_queries`` queries, ``k`` outside 1..``serve.max_k``, ``return`` not one of
``RETURNS``) raises an ``MlflowException``
naming the field and quoting at most 40 characters of what was sent. Served by ``mlflow models
serve``, the request goes through ``invocations`` (installed when the model loads), so the answer
is HTTP 400 with that message only, never a stack trace. A query longer than the encoder's
``max_query_length`` tokens is cut there. The limits are logged with the model (``serve.json``);
a following server checks each request against the limits of the version that answers it.
"""

from __future__ import annotations

import json
import os
import tempfile
from io import StringIO
from pathlib import Path

import mlflow.pyfunc
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import scoring_server

import model_code
from model_code.config import ServeParams
from model_code.retrievers import Retriever, kind_class, load_chain, read_manifest
from model_code.versions.documents import DocumentStore
from tracking.following import MODEL_ENV, Follower, ServedVersion, on_this_machine, version_of

PIP_REQUIREMENTS = [
    "torch==2.13.0",
    "transformers==5.23.0",
    "tokenizers==0.23.3",  # the SVDR binary index tokenises through the Rust backend directly
    "faiss-cpu==1.15.1",
    "pymilvus==3.0.2",  # index.backend: milvus
    "milvus-lite==3.2.2",
    "numpy>=2,<3",
    "numba>=0.61",  # IncDSI's optimiser, imported with its head
    "scipy>=1.13",
    "pandas==2.3.3",
    "pyarrow>=18",
    "bm25s==0.3.16",
    "PyStemmer==3.1.0",
    "optuna==5.0.0",
    "pydantic>=2.8,<3",
    "pyyaml>=6",
    "tqdm",
    "mlflow==3.17.2",
]

# the queries and the params of one call: MLflow infers the signature from predict's type hints and
# this example (the params schema, k with its default, comes from the example's params)
INPUT_EXAMPLE = (["how do I merge two sorted lists"], {"k": 10, "return": "ids"})
RETURNS = ("ids", "documents")  # what a search answers besides the ranked ids and scores: nothing, or the documents


def log_retriever(encoder_dir: Path, retriever_dir: Path, serve: ServeParams, encoder_uri: str | None = None,
                  retriever_bases: list[str] | None = None, signature: ModelSignature | None = None):
    """Log the saved retriever (and, for kinds that use one, the encoder: a copy of
    ``encoder_dir``, or a reference to the already logged ``encoder_uri``) with the endpoint's
    ``serve`` limits as the pyfunc model of the active run; return its info. A delta retriever
    needs ``retriever_bases``: the artifact URIs it applies to, a whole copy first.

    ``signature``: the one a version of the same pyfunc was logged with (an update passes its
    parent's), set as is. Without it MLflow derives the signature from ``predict``'s type hints and
    ``INPUT_EXAMPLE`` (the params' schema comes from the example), loading the model twice to run
    the example (once to infer, once to check it serves): 1.2 of the 1.7 s an update's logging
    took on 2 cores, before the endpoint could serve the update. The pyfunc is the same code in
    every version, so a lineage's updates reuse the signature its full training was checked with."""
    manifest = read_manifest(retriever_dir)
    kind = manifest["kind"]
    if bool(manifest.get("delta")) != bool(retriever_bases):
        raise ValueError(f"{retriever_dir}: a delta retriever is logged with the retrievers it applies to, "
                         "a whole one without")
    artifacts = {"retriever": str(retriever_dir)}
    with tempfile.TemporaryDirectory() as tmp:
        limits = Path(tmp) / "serve.json"
        limits.write_text(serve.model_dump_json())
        artifacts["serve"] = str(limits)
        if retriever_bases:
            chain = Path(tmp) / "retriever_chain.json"
            chain.write_text(json.dumps({"bases": retriever_bases}))
            artifacts["retriever_chain"] = str(chain)
        if kind_class(kind).uses_encoder and encoder_uri is not None:
            reference = Path(tmp) / "encoder_ref.json"
            reference.write_text(json.dumps({"encoder_uri": encoder_uri}))
            artifacts["encoder_ref"] = str(reference)
        elif kind_class(kind).uses_encoder:
            artifacts["encoder"] = str(encoder_dir)
        info = mlflow.pyfunc.log_model(
            name="retriever",
            python_model=str(Path(__file__).with_name("pyfunc_entry.py")),
            artifacts=artifacts,
            code_paths=[str(Path(model_code.__file__).parent), str(Path(__file__).parent)],
            pip_requirements=PIP_REQUIREMENTS,
            input_example=INPUT_EXAMPLE if signature is None else None,
        )
    if signature is not None:
        mlflow.models.set_signature(info.model_uri, signature)
    return info


def bad_request(message: str) -> MlflowException:
    """The error of a bad request: the scoring server answers it with HTTP 400 and ``message``."""
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


# MLflow's other fields for a model's input: beside "inputs" one was ignored, so a body with two is ambiguous
OTHER_INPUT_FIELDS = ("instances", "dataframe_split", "dataframe_records")


def checked_request(body, limits: ServeParams) -> tuple[list[str], dict]:
    """The queries and params (``k``, ``return``) of a search request ``{"inputs": [...],
    "params": {"k": ..., "return": ...}}`` (the parsed JSON body, or what ``predict`` was called
    with, defaults filled in), or an ``MlflowException`` (HTTP 400)
    naming the field. A message quotes at most 40 characters of any value sent, so an answer stays
    short whatever the request holds."""
    if not isinstance(body, dict):
        raise bad_request('body: expected a JSON object {"inputs": [query, ...], "params": {"k": ...}}')
    for field in body:
        if field in OTHER_INPUT_FIELDS:
            raise bad_request(f"body: {field!r} is not taken: the queries go in 'inputs' alone "
                              "(two input fields are ambiguous)")
        if field not in ("inputs", "params"):
            raise bad_request(f"body: unknown field {field!r:.40}; known: inputs, params")
    params = {} if body.get("params") is None else body["params"]
    if not isinstance(params, dict):
        raise bad_request(f"params: expected an object such as {{'k': 10}}, got {type(params).__name__}")
    for key in params:
        if key not in ("k", "return"):
            raise bad_request(f"params: unknown key {key!r:.40}; known: k, return")
    queries = body.get("inputs")
    if not isinstance(queries, list) or not queries:
        raise bad_request("inputs: expected a non-empty list of query strings")
    if len(queries) > limits.max_queries:
        raise bad_request(f"inputs: {len(queries)} queries in one request; "
                          f"at most {limits.max_queries} (serve.max_queries)")
    for position, query in enumerate(queries):
        if not isinstance(query, str):
            raise bad_request(f"inputs[{position}]: Expected type str, but got {type(query).__name__}")
        if not query.strip():
            raise bad_request(f"inputs[{position}]: a query must be a non-empty string, got {query!r:.40}")
        try:
            query.encode()
        except UnicodeEncodeError as error:  # only a lone surrogate fails UTF-8; the tokenizers raise on it
            raise bad_request(f"inputs[{position}]: not encodable text "
                              f"(lone surrogate at position {error.start})") from None
    k = params.get("k", 10)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limits.max_k:
        raise bad_request(f"params.k: must be an integer in 1..{limits.max_k} (serve.max_k), got {k!r:.40}")
    returned = params.get("return", "ids")
    if returned not in RETURNS:
        raise bad_request(f"params.return: one of {', '.join(RETURNS)}, got {returned!r:.40}")
    return queries, {"k": k, "return": returned}


def invocations(data: bytes, content_type: str | None, model,
                input_schema) -> scoring_server.InvocationsResponse:
    """The scoring server's handling of one ``/invocations`` request for this model: ``mlflow
    models serve`` looks ``scoring_server.invocations`` up per request, and ``load_context``
    points it here in every worker before the server starts (``input_schema`` is unused:
    ``checked_request`` is the schema).

    Why replace MLflow's handler rather than check in ``predict`` alone: it decides what
    ``predict`` never sees. It drops params outside the model's schema (``{"kk": 5}`` searched with
    k = 10) and body fields beside ``inputs`` (``instances`` was ignored), quotes the whole body in
    its malformed-JSON error and the whole input in front of any error ``predict`` raises, and
    answers any other exception with its stack trace. Here the parsed body goes whole to
    ``checked_request``, whose message is the whole answer; a failure after it reaches the server
    as is, which logs it and answers 500 with no detail. Only JSON is taken: MLflow's CSV and
    Parquet parsers answer their errors with a stack trace."""
    if (content_type or "").split(";")[0].strip() != scoring_server.CONTENT_TYPE_JSON:
        usage = 'this endpoint takes application/json: {"inputs": [query, ...], "params": {"k": ...}}'
        return scoring_server.InvocationsResponse(usage, 415, "text/plain")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as error:  # RecursionError: nested deeper than the parser goes
        raise bad_request(f"body: not readable as JSON ({error})") from None
    queries, params = checked_request(body, model.unwrap_python_model().served.limits)
    answer = StringIO()
    scoring_server.predictions_to_json(model.predict(queries, params=params), answer)
    return scoring_server.InvocationsResponse(answer.getvalue(), 200, "application/json")


def encoder_path(artifacts: dict[str, str], scratch: Path | None = None) -> str | None:
    """Where the model's encoder is on this machine: its own copy, or the referenced lineage
    encoder (a file store's own directory, no copy; other stores download it once per load,
    under ``scratch``: ``on_this_machine``)."""
    if "encoder_ref" in artifacts:
        uri = json.loads(Path(artifacts["encoder_ref"]).read_text())["encoder_uri"]
        return str(on_this_machine(uri, scratch))
    return artifacts.get("encoder")


def retriever_bases(artifacts: dict[str, str]) -> list[str]:
    """The artifact URIs a delta retriever applies to, a whole copy first (none for a whole one)."""
    if "retriever_chain" not in artifacts:
        return []
    return json.loads(Path(artifacts["retriever_chain"]).read_text())["bases"]


def retriever_dirs(artifacts: dict[str, str], scratch: Path | None = None) -> list[Path]:
    """The directories that load the model's retriever on this machine, in the order to apply
    them (a file store's own directories, no copy; other stores download each once per load,
    under ``scratch``)."""
    bases = [on_this_machine(uri, scratch) for uri in retriever_bases(artifacts)]
    return [*bases, Path(artifacts["retriever"])]


def own_run_id(artifacts: dict[str, str]) -> str | None:
    """The run that logged the model whose artifacts these are (its MLmodel sits two levels above
    each artifact); None while the model is being logged (its input example runs from elsewhere)."""
    model_file = Path(artifacts["serve"]).parents[1] / "MLmodel"
    return mlflow.models.Model.load(str(model_file)).run_id if model_file.is_file() else None


def load_artifacts(artifacts: dict[str, str], scratch: Path | None = None) -> tuple[Retriever, DocumentStore | None]:
    """The retriever a version's artifacts (local paths by name) hold, with its encoder, and the
    text of its documents (None for a version registered without it); what has to be downloaded
    for it goes under ``scratch``."""
    directories = retriever_dirs(artifacts, scratch)
    return load_chain(directories, encoder_path(artifacts, scratch)), DocumentStore.load_chain(directories)


class RetrieverModel(mlflow.pyfunc.PythonModel):
    """Answers from one served version at a time; with ``fresh-registry serve`` that version
    follows a registry alias (``tracking.following``)."""

    def load_context(self, context) -> None:
        name = os.environ.get(MODEL_ENV)  # set by fresh-registry serve: look up which version this is
        version, tags = (version_of(name, own_run_id(context.artifacts)) if name else None) or (None, {})
        self._served = ServedVersion.loaded(load_artifacts, context.artifacts, version, tags)
        self.follower = Follower.from_environment(self._served, load_artifacts, self._served.limits.refresh_seconds)
        if self.follower is not None:
            self.follower.start()
        scoring_server.invocations = invocations  # the server's request handling for this model (see there)

    def catch_up(self, name: str, alias: str) -> str | None:
        """Serve what a server following ``name@alias`` serves now, in one step and with no thread:
        the alias's version extended by the updates committed after it (``fresh-registry search``
        answers as the endpoint does, before an update's version is registered). Returns the version."""
        self.follower = Follower(name, alias, self.served, load_artifacts, self.served.limits.refresh_seconds)
        self.follower.follow_once()
        return self.served.version

    @property
    def served(self) -> ServedVersion:
        return self.follower.served if self.follower is not None else self._served

    @property
    def retriever(self) -> Retriever:
        """The retriever answering now (in process: ``unwrap_python_model().retriever``)."""
        return self.served.retriever

    def predict(self, context, model_input: list[str], params: dict | None = None) -> pd.DataFrame:
        if isinstance(model_input, pd.DataFrame):  # a caller bypassing the type-hinted conversion
            model_input = model_input["query" if "query" in model_input else model_input.columns[0]].tolist()
        served = self.served  # one version for the whole request, whatever the follower swaps meanwhile
        with served.lock.reading():  # checked against the limits of the version that answers (a replay changes both)
            queries, params = checked_request({"inputs": model_input, "params": params}, served.limits)
            if params["return"] == "documents" and served.documents is None:
                raise bad_request(f"params.return: version {served.version} was registered without its documents' "
                                  "text (before versions kept it); search it for ids, or serve a version registered since")
            hits, version = served.retriever.search(queries, params["k"]), served.version
            documents = [served.documents.fetch(h.doc_ids) for h in hits] if params["return"] == "documents" else None
        answer = pd.DataFrame({"query": queries, "doc_ids": [h.doc_ids for h in hits],
                               "scores": [h.scores for h in hits], "model_version": [version] * len(queries)})
        return answer if documents is None else answer.assign(documents=documents)
