"""Stage 2, query generation: pseudo-queries for training without (or beyond) labelled queries.

Inverse cloze task (ICT) for training: a pseudo-query is a random contiguous span of
``span_tokens`` whitespace tokens of the document, ``per_document`` spans per document, seeded.
Generated queries for the IncDSI head (``data/generator.py``): a seq2seq model when
``querygen.generator.model`` is set, else extractive ones; cached under ``.cache/querygen``.
Outputs: ``data/pseudo_queries.parquet`` and ``data/generated_queries.parquet``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from model_code.config import Params, QuerygenParams
from model_code.data.generator import generate_queries
from model_code.data.ingested import IngestedData, load_ingested
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


def run(settings: Params, layout: Layout) -> dict:
    params, data = settings.querygen, load_ingested(layout.ingested)
    frame = generate(params, data)
    write_parquet(layout.pseudo_queries, frame)
    generated = generate_queries(data.corpus, params.generator, layout.querygen_cache)
    write_parquet(layout.generated_queries, generated)
    return {
        "pseudo_queries": len(frame),
        "documents": int(frame["doc_id"].nunique()),
        "method": params.method,
        "generated_queries": len(generated),
        "generator": "doc2query" if params.generator.model else "extractive",
    }
