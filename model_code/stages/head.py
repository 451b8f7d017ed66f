"""IncDSI head stage (``fresh-retriever build-head``): the document-id classifier over the *old*
documents, ready for IncDSI additions, and the addition parameters tuned for it.

Rows are initialised from the trained encoder's document embeddings and fine-tuned with
cross-entropy over document ids on the old documents' natural train queries plus their generated
queries; each document's representative query is the mean of those query embeddings. Then the
addition hyper-parameters are tuned on a simulated addition of the tune documents plus held-out
old documents (``incremental/tuning.py``; ``incdsi.tune_trials: 0`` keeps params.yaml's values).
Output: ``Layout.incdsi_head`` (weights.npy, rep_queries.npy, doc_ids.txt, manifest.json, and
addition.json — the parameters every later addition to this head reads, with the trials).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

import pandas as pd
import torch

from model_code.config import IncDSIParams, Params
from model_code.data.ingested import IngestedData, passage_texts
from model_code.incremental.head import train_head
from model_code.incremental.incdsi import ADDITION_FILE, AdditionParams
from model_code.incremental.tuning import simulate_additions, tune_addition
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.encoder import Encoder

log = logging.getLogger(__name__)


def head_queries(data: IngestedData, generated: pd.DataFrame, doc_ids: list[str]) -> pd.DataFrame:
    """(doc_id, query, natural) of the given documents: natural train queries, then generated ones."""
    keep = set(doc_ids)
    text = dict(zip(data.queries["query_id"], data.queries["text"]))
    natural = data.qrels.get("train", pd.DataFrame(columns=["query_id", "doc_id", "relevance"]))
    natural = natural[(natural["relevance"] > 0) & natural["doc_id"].isin(keep)]
    generated = generated[generated["doc_id"].isin(keep)]
    pairs = pd.concat([
        pd.DataFrame({"doc_id": natural["doc_id"], "query": natural["query_id"].map(text), "natural": True}),
        pd.DataFrame({"doc_id": generated["doc_id"], "query": generated["query"], "natural": False}),
    ], ignore_index=True)
    return pairs.dropna().reset_index(drop=True)


def tuned_addition(params: IncDSIParams, doc_vectors: torch.Tensor, doc_ids: list[str], tune_vectors: torch.Tensor,
                   tune_ids: list[str], pairs: pd.DataFrame, query_vectors: torch.Tensor) -> dict:
    """The content of addition.json for a head over ``doc_ids`` (``pairs``/``query_vectors``
    cover those documents and ``tune_ids``)."""
    defaults = AdditionParams.from_values(params)
    if not params.tune_trials:
        return {"source": "params.yaml", "params": asdict(defaults)}
    simulation = simulate_additions(doc_vectors, doc_ids, pairs, query_vectors, tune_vectors, tune_ids,
                                    params.tune_share, params.head_epochs, params.head_learning_rate, params.seed)
    best, trials = tune_addition(simulation, params.tune_trials, params.seed, params.tune_beta, base=defaults)
    log.info("IncDSI addition parameters tuned over %d trials: %s", params.tune_trials, best)
    return {"source": "tuned", "params": asdict(best), "trials": trials, "simulation": {
        "head_documents": len(simulation.head.doc_ids), "additions": len(simulation.additions),
        "new_eval_queries": len(simulation.new_eval[1]), "old_eval_queries": len(simulation.old_eval[1])}}


def run(params: Params, data: IngestedData, layout: Layout) -> dict:
    groups = pd.read_parquet(layout.ingested / "doc_groups.parquet")
    old = set(groups.loc[groups["group"] == "old", "doc_id"])
    tune_ids = groups.loc[groups["group"] == "tune", "doc_id"].tolist()
    corpus = data.corpus[data.corpus["doc_id"].isin(old | set(tune_ids))]
    encoder = Encoder(str(layout.encoder), params.encoder.pooling)
    encoded = torch.from_numpy(encoder.encode(passage_texts(corpus), params.encoder.max_passage_length,
                                              params.encoder.batch_size, desc="encoding old and tune documents"))
    on_old = corpus["doc_id"].isin(old).to_numpy()
    doc_ids, tune_ids = corpus["doc_id"][on_old].tolist(), corpus["doc_id"][~on_old].tolist()
    doc_vectors, tune_vectors = encoded[on_old], encoded[~on_old]
    pairs = head_queries(data, pd.read_parquet(layout.generated_queries), doc_ids + tune_ids)
    query_vectors = torch.from_numpy(encoder.encode(pairs["query"].tolist(), params.encoder.max_query_length,
                                                    params.encoder.batch_size, desc="encoding head queries"))
    on_head = pairs["doc_id"].isin(old).to_numpy()
    incdsi = params.incdsi
    head, _, losses = train_head(doc_vectors, doc_ids, query_vectors[on_head], pairs["doc_id"][on_head].tolist(),
                                 incdsi.head_epochs, incdsi.head_learning_rate, incdsi.seed)
    addition = tuned_addition(incdsi, doc_vectors, doc_ids, tune_vectors, tune_ids, pairs, query_vectors)
    manifest = {"documents": len(doc_ids), "queries": int(on_head.sum()), "epochs": incdsi.head_epochs,
                "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
                "addition": {"source": addition["source"], **addition["params"]}}
    with atomic_path(layout.incdsi_head) as out:
        head.save(out)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (out / ADDITION_FILE).write_text(json.dumps(addition, indent=2) + "\n")
    return manifest
