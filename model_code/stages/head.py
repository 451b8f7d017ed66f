"""IncDSI head stage (``fresh-retriever build-head``): the document-id classifier over the *old*
documents, ready for IncDSI additions.

Rows are initialised from the trained encoder's document embeddings and fine-tuned with
cross-entropy over document ids on the old documents' natural train queries plus their generated
queries; each document's representative query is the mean of those query embeddings.
Output: ``Layout.incdsi_head`` (weights.npy, rep_queries.npy, doc_ids.txt, manifest.json).
"""

from __future__ import annotations

import json

import pandas as pd
import torch

from model_code.config import Params
from model_code.data.ingested import IngestedData, passage_texts
from model_code.incremental.head import build_head, finetune_head
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.encoder import Encoder


def head_queries(data: IngestedData, generated: pd.DataFrame, doc_ids: list[str]) -> pd.DataFrame:
    """(doc_id, query) pairs of the given documents: natural train queries + generated ones."""
    keep = set(doc_ids)
    text = dict(zip(data.queries["query_id"], data.queries["text"]))
    natural = data.qrels.get("train", pd.DataFrame(columns=["query_id", "doc_id", "relevance"]))
    natural = natural[(natural["relevance"] > 0) & natural["doc_id"].isin(keep)]
    pairs = pd.concat([
        pd.DataFrame({"doc_id": natural["doc_id"], "query": natural["query_id"].map(text)}),
        generated[generated["doc_id"].isin(keep)][["doc_id", "query"]],
    ], ignore_index=True)
    return pairs.dropna()


def run(params: Params, data: IngestedData, layout: Layout) -> dict:
    groups = pd.read_parquet(layout.ingested / "doc_groups.parquet")
    old = set(groups.loc[groups["group"] == "old", "doc_id"])
    corpus = data.corpus[data.corpus["doc_id"].isin(old)]
    doc_ids = corpus["doc_id"].tolist()
    passages = passage_texts(corpus)
    encoder = Encoder(str(layout.encoder), params.encoder.pooling)
    doc_vectors = torch.from_numpy(encoder.encode(passages, params.encoder.max_passage_length,
                                                  params.encoder.batch_size, desc="encoding old documents"))
    pairs = head_queries(data, pd.read_parquet(layout.generated_queries), doc_ids)
    query_vectors = torch.from_numpy(encoder.encode(pairs["query"].tolist(), params.encoder.max_query_length,
                                                    params.encoder.batch_size, desc="encoding head queries"))
    row = {d: i for i, d in enumerate(doc_ids)}
    query_rows = torch.tensor([row[d] for d in pairs["doc_id"]], dtype=torch.long)
    head = build_head(doc_vectors, doc_ids, query_vectors, query_rows)
    losses = finetune_head(head, query_vectors, query_rows, params.incdsi.head_epochs,
                           params.incdsi.head_learning_rate, seed=params.incdsi.seed) if params.incdsi.head_epochs else []
    manifest = {"documents": len(doc_ids), "queries": len(pairs), "epochs": params.incdsi.head_epochs,
                "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None}
    with atomic_path(layout.incdsi_head) as out:
        head.save(out)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
