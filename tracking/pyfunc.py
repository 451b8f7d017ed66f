"""The retriever as an MLflow pyfunc: encoder + searcher (FAISS index, or IncDSI document-id head)
+ id map, served as one model.

Artifacts: ``encoder``, ``index`` (always: a deployment keeps the dense index for drift
statistics) and, for an IncDSI deployment, ``incdsi_head``; ``model_config["retriever"]`` names
the one that searches.
``predict`` takes query strings (a list, or a DataFrame with a ``query`` column) and returns one
row per query with the ranked ``doc_ids`` and their ``scores``; the ``k`` param sets the depth.
"""

from __future__ import annotations

import mlflow.pyfunc
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
from mlflow.types.schema import Array

SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec(DataType.string)]),
    outputs=Schema(
        [
            ColSpec(DataType.string, "query"),
            ColSpec(Array(DataType.string), "doc_ids"),
            ColSpec(Array(DataType.double), "scores"),
        ]
    ),
    params=ParamSchema([ParamSpec("k", DataType.long, 10)]),
)


SEARCHER_ARTIFACT = {"dense": "index", "incdsi": "incdsi_head"}  # retriever kind -> artifact that searches


class RetrieverModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        from model_code.config import EncoderParams
        from model_code.retriever import Retriever

        encoder_params = EncoderParams(**context.model_config["encoder"])
        kind = context.model_config.get("retriever", "dense")
        self.retriever = Retriever.load(context.artifacts["encoder"], context.artifacts[SEARCHER_ARTIFACT[kind]],
                                        encoder_params, kind)

    def predict(self, context, model_input, params: dict | None = None) -> pd.DataFrame:
        if isinstance(model_input, pd.DataFrame):
            queries = model_input["query" if "query" in model_input else model_input.columns[0]].astype(str).tolist()
        else:
            queries = [str(q) for q in model_input]
        k = int((params or {}).get("k", 10))
        hits = self.retriever.search(queries, k)
        return pd.DataFrame(
            {"query": queries, "doc_ids": [h.doc_ids for h in hits], "scores": [h.scores for h in hits]}
        )
