"""Stage 2b, hard-negative mining: per training query, documents a retriever ranks high that are
not relevant to it (MLR §4: one of the top 100 BM25 results per query; DPR, ANCE).

The queries are those of the train qrels (what supervised training pairs). Each is searched
``train.mining.depth`` deep with BM25 and/or a dense encoder (``train.mining.source``); every
document relevant to it in any split's qrels, and a document with the query's own id (BEIR's
identical-id rule), is removed, and what remains is the query's pool. The trainer draws
``train.hard_negatives`` of a pool each step. With ``train.hard_negatives: 0`` (the default) or a
retriever kind without an encoder nothing is mined.

Output (``Layout.hard_negatives``): negatives.parquet (query_id, query, doc_id, rank, source)
and summary.json.
"""

from __future__ import annotations

import json

import pandas as pd

from model_code.config import EncoderParams, MiningParams, Params
from model_code.data.ingested import IngestedData, load_ingested
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.embedding_cache import EmbeddingCache
from model_code.models.encoder import Encoder
from model_code.retrievers import kind_class
from model_code.retrievers.bm25 import BM25Params, BM25Retriever
from model_code.stages import not_used
from model_code.stores import exact_store

COLUMNS = ["query_id", "query", "doc_id", "rank", "source"]


def relevant_documents(data: IngestedData) -> dict[str, set[str]]:
    """Every document judged relevant (relevance > 0) to each training query: the train split's
    qrels only (mining serves training, and no decision or training step reads test)."""
    qrels = data.qrels_for("train")
    qrels = qrels[qrels["relevance"] > 0]
    return {query: set(docs) for query, docs in qrels.groupby("query_id")["doc_id"]}


def _ranked(data: IngestedData, texts: list[str], source: str, depth: int,
            encoder: EncoderParams, model: str | None, cache: EmbeddingCache | None) -> list[list[str]]:
    """The top ``depth`` document ids of each query text from ``source`` (bm25 or dense); the
    corpus's dense vectors through ``cache`` when given (the cluster stage encoded it already)."""
    if source == "bm25":  # Lucene BM25 with English stemming and stopwords (the bm25 kind's defaults);
        hits = BM25Retriever(data.corpus, BM25Params()).search(texts, depth)  # a 0 score shares no term:
        return [[d for d, score in zip(hit.doc_ids, hit.scores) if score > 0] for hit in hits]  # not BM25's pick
    dense = Encoder(model or encoder.model, encoder.pooling)
    passages, length = data.passages(), encoder.max_passage_length
    documents = (cache.encode(dense, passages, length, encoder.batch_size, desc="encoding corpus") if cache else
                 dense.encode(passages, length, encoder.batch_size, desc="encoding corpus"))
    index = exact_store(documents, data.corpus["doc_id"].tolist())
    return index.search(dense.encode(texts, encoder.max_query_length, encoder.batch_size, side="query"), depth)[1]


def mine(data: IngestedData, params: MiningParams, encoder: EncoderParams,
         cache: EmbeddingCache | None = None) -> pd.DataFrame:
    """The pools of the train qrels' queries, one row per (query, negative), best-ranked first."""
    relevant = relevant_documents(data)
    queries = data.queries[data.queries["query_id"].isin(set(data.qrels_for("train")["query_id"]) & set(relevant))]
    sources = ["bm25", "dense"] if params.source == "both" else [params.source]
    rows = []
    for source in sources:
        ranked = _ranked(data, queries["text"].tolist(), source, params.depth, encoder, params.model, cache)
        for query_id, text, doc_ids in zip(queries["query_id"], queries["text"], ranked):
            excluded = relevant[query_id] | {query_id}
            kept = [d for d in doc_ids if d not in excluded]
            rows += [(query_id, text, d, rank, source) for rank, d in enumerate(kept)]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.drop_duplicates(["query_id", "doc_id"]).reset_index(drop=True)  # "both": the first source's rank


def run(settings: Params, layout: Layout) -> dict:
    params = settings.train
    if not kind_class(settings.retriever.kind).uses_encoder:
        return not_used(layout.hard_negatives, f"retriever.kind {settings.retriever.kind} uses no encoder")
    if not params.hard_negatives:
        return not_used(layout.hard_negatives, "train.hard_negatives is 0")
    data = load_ingested(layout.ingested)
    negatives = mine(data, params.mining, settings.encoder, EmbeddingCache(layout.embedding_cache))
    per_query = negatives.groupby("query_id").size()
    summary = {"queries": int(per_query.size), "negatives": len(negatives), "source": params.mining.source,
               "depth": params.mining.depth, "min_per_query": int(per_query.min()) if len(per_query) else 0}
    with atomic_path(layout.hard_negatives) as out:
        out.mkdir()
        negatives.to_parquet(out / "negatives.parquet", index=False)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
