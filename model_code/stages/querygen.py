"""Stage 2, query generation: pseudo-queries for training without (or beyond) labelled queries.

Inverse cloze task (ICT): a pseudo-query is a random contiguous span of ``span_tokens``
whitespace tokens of the document, ``per_document`` spans per document, seeded. The ``method``
switch keeps room for a seq2seq (doc2query) generator.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from model_code.config import QuerygenParams
from model_code.data.ingested import IngestedData
from model_code.io import write_parquet
from model_code.layout import Layout


def ict_spans(text: str, span_tokens: int, count: int, rng: np.random.Generator) -> list[str]:
    words = text.split()
    if len(words) <= span_tokens:
        return [" ".join(words)] * count
    starts = rng.integers(0, len(words) - span_tokens + 1, size=count)
    return [" ".join(words[s : s + span_tokens]) for s in starts]


def generate(params: QuerygenParams, data: IngestedData) -> pd.DataFrame:
    rng = np.random.default_rng(params.seed)
    rows = []
    for doc_id, text in zip(data.corpus["doc_id"], data.corpus["text"]):
        for k, span in enumerate(ict_spans(text, params.span_tokens, params.per_document, rng)):
            rows.append({"query_id": f"{doc_id}#ict{k}", "doc_id": doc_id, "text": span, "method": params.method})
    return pd.DataFrame(rows, columns=["query_id", "doc_id", "text", "method"])


def run(params: QuerygenParams, data: IngestedData, layout: Layout) -> dict:
    frame = generate(params, data)
    write_parquet(layout.pseudo_queries, frame)
    return {"pseudo_queries": len(frame), "documents": int(frame["doc_id"].nunique()), "method": params.method}
