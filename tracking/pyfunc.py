"""The retriever as an MLflow pyfunc: any registered retriever kind, served as one model.

Artifacts: ``retriever`` (a saved retriever directory, whose manifest names its kind) and, for
kinds that use one, the encoder: either a copy (``encoder``, what a full training logs) or
``encoder_ref``, a small JSON file holding the artifact URI of the encoder its lineage's full
training logged (what an incremental update logs: updates keep the encoder, so each one would
otherwise store another copy of the same weights). An update's ``retriever`` may hold only what it
changed (a delta); then ``retriever_chain`` lists the artifact URIs of the retrievers it is applied
to, a whole copy first, and loading replays them in order. ``predict`` takes query strings (a list, or a DataFrame whose
first or ``query`` column holds them) and returns one row per query with the ranked ``doc_ids``
and their ``scores``; the ``k`` param sets the depth. A bad request (no queries, a query that is
not a non-empty string, more than ``serve.max_queries`` queries, ``k`` outside 1..``serve.max_k``)
raises an ``MlflowException`` naming the field, which the scoring server answers with HTTP 400 and
that message only (no stack trace); a query longer than the encoder's ``max_query_length`` tokens
is cut there. The limits are logged with the model (``serve.json``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import mlflow.pyfunc
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

import model_code
from model_code.config import ServeParams
from model_code.retrievers import kind_class, load_chain, read_manifest

PIP_REQUIREMENTS = [
    "torch==2.13.0",
    "transformers==5.23.0",
    "tokenizers==0.23.3",  # the SVDR binary index tokenises through the Rust backend directly
    "faiss-cpu==1.15.1",
    "numpy>=2,<3",
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
INPUT_EXAMPLE = (["how do I merge two sorted lists"], {"k": 10})


def log_retriever(encoder_dir: Path, retriever_dir: Path, serve: ServeParams, encoder_uri: str | None = None,
                  retriever_bases: list[str] | None = None):
    """Log the saved retriever (and, for kinds that use one, the encoder: a copy of
    ``encoder_dir``, or a reference to the already logged ``encoder_uri``) with the endpoint's
    ``serve`` limits as the pyfunc model of the active run; return its info. A delta retriever
    needs ``retriever_bases``: the artifact URIs it applies to, a whole copy first."""
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
        return mlflow.pyfunc.log_model(
            name="retriever",
            python_model=str(Path(__file__).with_name("pyfunc_entry.py")),
            artifacts=artifacts,
            code_paths=[str(Path(model_code.__file__).parent), str(Path(__file__).parent)],
            pip_requirements=PIP_REQUIREMENTS,
            input_example=INPUT_EXAMPLE,
        )


def checked_request(queries, params: dict, limits: ServeParams) -> tuple[list[str], int]:
    """The queries and ``k`` of a search request, or an ``MlflowException`` (HTTP 400) naming the field."""
    def bad(message: str) -> MlflowException:
        return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)

    if not isinstance(queries, list) or not queries:
        raise bad("inputs: expected a non-empty list of query strings")
    if len(queries) > limits.max_queries:
        raise bad(f"inputs: {len(queries)} queries in one request; at most {limits.max_queries} (serve.max_queries)")
    for position, query in enumerate(queries):
        if not isinstance(query, str) or not query.strip():
            raise bad(f"inputs[{position}]: a query must be a non-empty string, got {type(query).__name__} {query!r:.40}")
    k = params.get("k", 10)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limits.max_k:
        raise bad(f"params.k: must be an integer in 1..{limits.max_k} (serve.max_k), got {k!r:.40}")
    return queries, k


def encoder_path(artifacts: dict[str, str]) -> str | None:
    """Where the model's encoder is on this machine: its own copy, or the referenced lineage
    encoder (a file store's own directory, no copy; other stores download it once per load)."""
    if "encoder_ref" in artifacts:
        uri = json.loads(Path(artifacts["encoder_ref"]).read_text())["encoder_uri"]
        return mlflow.artifacts.download_artifacts(artifact_uri=uri)
    return artifacts.get("encoder")


def retriever_bases(artifacts: dict[str, str]) -> list[str]:
    """The artifact URIs a delta retriever applies to, a whole copy first (none for a whole one)."""
    if "retriever_chain" not in artifacts:
        return []
    return json.loads(Path(artifacts["retriever_chain"]).read_text())["bases"]


def retriever_dirs(artifacts: dict[str, str]) -> list[Path]:
    """The directories that load the model's retriever on this machine, in the order to apply
    them (a file store's own directories, no copy; other stores download each once per load)."""
    bases = [Path(mlflow.artifacts.download_artifacts(artifact_uri=uri)) for uri in retriever_bases(artifacts)]
    return [*bases, Path(artifacts["retriever"])]


class RetrieverModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        self.retriever = load_chain(retriever_dirs(context.artifacts), encoder_path(context.artifacts))
        self.limits = ServeParams.model_validate_json(Path(context.artifacts["serve"]).read_text())

    def predict(self, context, model_input: list[str], params: dict | None = None) -> pd.DataFrame:
        if isinstance(model_input, pd.DataFrame):  # a caller bypassing the type-hinted conversion
            model_input = model_input["query" if "query" in model_input else model_input.columns[0]].tolist()
        queries, k = checked_request(model_input, params or {}, self.limits)
        hits = self.retriever.search(queries, k)
        return pd.DataFrame(
            {"query": queries, "doc_ids": [h.doc_ids for h in hits], "scores": [h.scores for h in hits]}
        )
