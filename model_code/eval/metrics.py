"""Retrieval metrics with ranx, and TREC run-file output.

Metric names follow ranx (``ndcg@10``, ``recall@100``, ``mrr@10``, ``hits@1`` ...). ranx compiles
its kernels with numba on first use in a fresh environment (~40 s once, cached afterwards).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

RunDict = dict[str, dict[str, float]]


def qrels_dict(qrels: pd.DataFrame) -> dict[str, dict[str, int]]:
    relevant = qrels[qrels["relevance"] > 0]
    out: dict[str, dict[str, int]] = {}
    for query_id, doc_id, relevance in zip(relevant["query_id"], relevant["doc_id"], relevant["relevance"]):
        out.setdefault(query_id, {})[doc_id] = int(relevance)
    return out


def evaluate(qrels: dict[str, dict[str, int]], run: RunDict, metrics: list[str]) -> tuple[dict, pd.DataFrame]:
    """Mean metrics and a per-query table. Queries missing from ``run`` count as retrieving nothing."""
    from ranx import Qrels, Run
    from ranx import evaluate as ranx_evaluate

    # ranx drops queries absent from the run from the average: give them an empty ranking instead,
    # via a sentinel document that is never relevant, so they score 0 as they should.
    full_run = {q: (run.get(q) or {"__none__": 0.0}) for q in qrels}
    ranx_qrels, ranx_run = Qrels(qrels), Run(full_run)
    means = ranx_evaluate(ranx_qrels, ranx_run, metrics, make_comparable=True)
    means = {metrics[0]: float(means)} if not isinstance(means, dict) else {k: float(v) for k, v in means.items()}
    per_query = pd.DataFrame({"query_id": list(ranx_qrels.keys())})
    for metric in metrics:
        per_query[metric] = ranx_evaluate(ranx_qrels, ranx_run, metric, return_mean=False, make_comparable=True)
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
    run = {}
    for query_id, ids, scores in zip(query_ids, hit_ids, hit_scores):
        pairs = [(d, float(s)) for d, s in zip(ids, scores) if not (ignore_identical_ids and d == query_id)]
        run[query_id] = dict(pairs[:k])
    return run


def write_trec_run(path: Path, run: RunDict, name: str) -> None:
    with open(path, "w") as handle:
        for query_id in sorted(run):
            ranked = sorted(run[query_id].items(), key=lambda item: -item[1])
            handle.writelines(f"{query_id} Q0 {doc_id} {rank} {score:.6f} {name}\n" for rank, (doc_id, score) in enumerate(ranked, start=1))
