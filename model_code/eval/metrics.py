"""Retrieval metrics as trec_eval computes them (pytrec_eval, the evaluator BEIR uses), and TREC run files.

Metric names are ``<name>@<k>``:

* ``ndcg@k``: trec_eval's ``ndcg_cut`` (gain = relevance grade, log2 discount), BEIR's nDCG;
* ``recall@k``, ``precision@k`` (``P``), ``map@k`` (``map_cut``): trec_eval's, as BEIR reports them;
* ``mrr@k``: reciprocal rank of the first relevant document within the top k (trec_eval's
  ``recip_rank`` of the ranking cut at k);
* ``hit_rate@k``: 1 if any relevant document is in the top k (trec_eval's ``success``);
* ``hits@k``: how many relevant documents are in the top k (``num_rel_ret`` of the cut ranking).

Every metric ranks a query's documents in trec_eval's order: score descending, ties broken by
document id descending, so tied scores give the same value in every metric and in BEIR's tables.
trec_eval holds scores as 32-bit floats, so scores equal in float32 are ties here too.
pytrec_eval is C (trec_eval itself): no compilation in a fresh process, unlike numba-based ranx.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

RunDict = dict[str, dict[str, float]]

# metric name -> trec_eval measure; CUT_MEASURES are computed on the ranking cut at k, because trec_eval's
# recip_rank and num_rel_ret take no cutoff
TREC_MEASURES = {"ndcg": "ndcg_cut", "recall": "recall", "precision": "P", "map": "map_cut", "hit_rate": "success"}
CUT_MEASURES = {"mrr": "recip_rank", "hits": "num_rel_ret"}


def parse_metric(metric: str) -> tuple[str, int]:
    """(name, k) of ``name@k``; a clear error for anything else, listing what is supported."""
    name, at, cutoff = metric.partition("@")
    if at and cutoff.isdigit() and int(cutoff) >= 1 and name in {**TREC_MEASURES, **CUT_MEASURES}:
        return name, int(cutoff)
    names = ", ".join(f"{n}@k" for n in [*TREC_MEASURES, *CUT_MEASURES])
    raise ValueError(f"unknown metric {metric!r}: use one of {names} (k a whole number >= 1)")


def qrels_dict(qrels: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Every judgement, by query, as BEIR's loader reads a qrels file: the last of two rows for one
    query and document holds, and grades of 0 or below are kept (trec_eval counts them as not
    relevant), so a query judged only not relevant is a judged query that scores 0, as in
    trec_eval and in BEIR's mean."""
    out: dict[str, dict[str, int]] = {}
    for query_id, doc_id, relevance in zip(qrels["query_id"], qrels["doc_id"], qrels["relevance"]):
        out.setdefault(query_id, {})[doc_id] = int(relevance)
    return out


def trec_order(hits: dict[str, float]) -> list[tuple[str, float]]:
    """A query's (doc, score) pairs in trec_eval's ranking order: score (as the float32 trec_eval holds)
    descending, then doc id descending."""
    return sorted(hits.items(), key=lambda pair: (np.float32(pair[1]), pair[0]), reverse=True)


def evaluate(qrels: dict[str, dict[str, int]], run: RunDict, metrics: list[str]) -> tuple[dict, pd.DataFrame]:
    """Mean metrics over every judged query and a per-query table (one row per query of ``qrels``, in its
    order). A query missing from ``run``, or with an empty ranking, scores 0 on every metric and counts
    in the mean, as ``trec_eval -c`` does (without -c, and in BEIR's average, a query the run lacks
    would be left out: a retriever that answers fewer queries would look better). A judged document
    missing from the corpus counts like any other, as in BEIR: never retrieved, it lowers its query's
    nDCG and recall, and a query judged on nothing else scores 0."""
    import pytrec_eval

    parsed = {metric: parse_metric(metric) for metric in metrics}
    per_query = pd.DataFrame({"query_id": list(qrels)})

    def score(measure: str, cutoff: int | None, ranking: RunDict) -> dict[str, float]:
        spec = measure if cutoff is None else f"{measure}.{cutoff}"
        key = measure if cutoff is None else f"{measure}_{cutoff}"
        results = pytrec_eval.RelevanceEvaluator(qrels, {spec}).evaluate(ranking)
        return {query_id: values[key] for query_id, values in results.items()}

    for metric, (name, k) in parsed.items():
        if name in TREC_MEASURES:
            values = score(TREC_MEASURES[name], k, run)
        else:
            cut = {query_id: dict(trec_order(hits)[:k]) for query_id, hits in run.items()}
            values = score(CUT_MEASURES[name], None, cut)
        per_query[metric] = per_query["query_id"].map(values).fillna(0.0).astype(float)
    means = {metric: float(per_query[metric].mean()) for metric in metrics}
    return means, per_query


def search_depth(k: int, ignore_identical_ids: bool) -> int:
    """Hits to ask for so that ``k`` remain after dropping the query's own document."""
    return k + 1 if ignore_identical_ids else k


def hits_to_run(query_ids: list[str], hit_ids: list[list[str]], hit_scores, k: int,
                ignore_identical_ids: bool) -> RunDict:
    """A run (query -> {doc: score}) of the top ``k`` hits per query. With ``ignore_identical_ids``
    a hit whose id equals the query's id is dropped first, as BEIR does: in corpora whose queries
    are themselves documents (argument retrieval, duplicate questions) a query's own document is
    not an answer to it, and would otherwise be retrieved first every time."""
    run: RunDict = {}
    for query_id, ids, scores in zip(query_ids, hit_ids, hit_scores):
        hits = run[query_id] = {}
        for doc_id, score in zip(ids, scores):
            if len(hits) == k:
                break
            if not (ignore_identical_ids and doc_id == query_id):
                hits.setdefault(doc_id, float(score))  # a document listed twice: its first, higher score
    return run


def write_trec_run(path: Path, run: RunDict, name: str) -> None:
    """A TREC run file, each query's documents ranked in trec_eval's order, each score written as the
    shortest text that reads back as the same float32, so trec_eval on the file ranks as ``evaluate``."""
    with open(path, "w") as handle:
        for query_id in sorted(run):
            handle.writelines(f"{query_id} Q0 {doc_id} {rank} {np.format_float_positional(np.float32(score))} {name}\n"
                              for rank, (doc_id, score) in enumerate(trec_order(run[query_id]), start=1))
