"""The retriever as an MLflow pyfunc: any registered retriever kind, served as one model.

Artifacts: ``retriever`` (a saved retriever directory, whose manifest names its kind) and, for
kinds that use one, ``encoder``. ``predict`` takes query strings (a list, or a DataFrame whose
first or ``query`` column holds them) and returns one row per query with the ranked ``doc_ids``
and their ``scores``; the ``k`` param sets the depth.
"""

from __future__ import annotations

import mlflow.pyfunc
import pandas as pd

# the queries and the params of one call: MLflow infers the signature from predict's type hints and
# this example (the params schema, k with its default, comes from the example's params)
INPUT_EXAMPLE = (["how do I merge two sorted lists"], {"k": 10})


class RetrieverModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        from model_code.retrievers import load_retriever

        self.retriever = load_retriever(context.artifacts["retriever"], context.artifacts.get("encoder"))

    def predict(self, context, model_input: list[str], params: dict | None = None) -> pd.DataFrame:
        if isinstance(model_input, pd.DataFrame):  # a caller bypassing the type-hinted conversion
            queries = model_input["query" if "query" in model_input else model_input.columns[0]].astype(str).tolist()
        else:
            queries = [str(q) for q in model_input]
        k = int((params or {}).get("k", 10))
        hits = self.retriever.search(queries, k)
        return pd.DataFrame(
            {"query": queries, "doc_ids": [h.doc_ids for h in hits], "scores": [h.scores for h in hits]}
        )
