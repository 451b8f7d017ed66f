"""Building a deployable IncDSI head (what the ``incdsi`` retriever kind's index stage does): the
document-id classifier, ready for IncDSI additions, and the addition parameters tuned for it. It
covers every ingested document (``retriever.incdsi.head_documents: all``, what a deployment
serves) or only the *old* ones (``old``: the IncDSI evaluation protocol, which adds the new
documents afterwards).

Rows are initialised from the trained encoder's document embeddings and fine-tuned with
cross-entropy over document ids on the covered documents' natural train queries plus their
generated queries; each document's representative query is the mean of those query embeddings. Then the
addition hyper-parameters are tuned on a simulated addition of the tune documents plus held-out
head documents (``methods/incdsi/tuning.py``; ``tune_trials: 0`` keeps params.yaml's values). The
result is saved by the kind as weights.npy, rep_queries.npy, doc_ids.json and addition.json (the
parameters every later addition to this head reads, with the trials).
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import pandas as pd
import torch

from model_code.data.ingested import IngestedData
from model_code.methods.incdsi.head import AdditionParams, IncDSIHead
from model_code.methods.incdsi.head_training import train_head
from model_code.methods.incdsi.settings import IncDSIParams
from model_code.methods.incdsi.tuning import simulate_additions, tune_addition

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
    best, trials = tune_addition(simulation, params.tune_trials, params.seed, params.tune_beta, defaults,
                                 params.tune_objective, params.tune_max_old_drop)
    log.info("IncDSI addition parameters tuned over %d trials: %s", params.tune_trials, best)
    return {"source": "tuned", "params": asdict(best), "objective": params.tune_objective, "trials": trials, "simulation": {
        "head_documents": len(simulation.head.doc_ids), "additions": len(simulation.additions),
        "new_eval_queries": len(simulation.new_eval[1]), "old_eval_queries": len(simulation.old_eval[1])}}


def build_deployable_head(settings: IncDSIParams, data: IngestedData, doc_groups: pd.DataFrame,
                          generated: pd.DataFrame, embed_documents, embed_queries) -> tuple[IncDSIHead, dict, dict]:
    """(head, addition.json content, summary) for the ingested corpus; ``doc_groups`` is the
    ingest stage's old/new/tune split, ``generated`` the querygen stage's generated queries and
    the two functions the trained encoder (documents frame -> vectors, texts -> vectors)."""
    tune = set(doc_groups.loc[doc_groups["group"] == "tune", "doc_id"])
    covered = (set(data.corpus["doc_id"]) if settings.head_documents == "all"
               else set(doc_groups.loc[doc_groups["group"] == "old", "doc_id"]))
    corpus = data.corpus[data.corpus["doc_id"].isin(covered | tune)]
    encoded = torch.from_numpy(embed_documents(corpus, desc="encoding head and tune documents"))
    ids = corpus["doc_id"].to_numpy()
    in_head, is_tune = corpus["doc_id"].isin(covered).to_numpy(), corpus["doc_id"].isin(tune).to_numpy()
    pairs = head_queries(data, generated, ids.tolist())
    query_vectors = torch.from_numpy(embed_queries(pairs["query"].tolist(), desc="encoding head queries"))
    pair_in_head = pairs["doc_id"].isin(covered).to_numpy()
    head, _, losses = train_head(encoded[in_head], ids[in_head].tolist(), query_vectors[pair_in_head],
                                 pairs["doc_id"][pair_in_head].tolist(), settings.head_epochs,
                                 settings.head_learning_rate, settings.seed)
    # the tuning simulation starts from the head's documents minus the tune documents and adds those
    start = in_head & ~is_tune
    addition = tuned_addition(settings, encoded[start], ids[start].tolist(), encoded[is_tune], ids[is_tune].tolist(),
                              pairs, query_vectors)
    summary = {"documents": int(in_head.sum()), "covers": settings.head_documents, "queries": int(pair_in_head.sum()),
               "epochs": settings.head_epochs, "first_loss": losses[0] if losses else None,
               "final_loss": losses[-1] if losses else None,
               "addition": {"source": addition["source"], **addition["params"]}}
    return head, addition, summary
