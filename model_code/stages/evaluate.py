"""Stage 6, evaluation: retrieve top-k for the evaluation split and score it as trec_eval does (pytrec_eval).

Outputs (``Layout.eval_report``): metrics.json (DVC metrics), run.trec, per_query.csv,
recall_curve.json (DVC plot) and metrics.png.
"""

from __future__ import annotations

import json
import time

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from model_code.config import EvalParams, Params
from model_code.data.ingested import IngestedData, load_ingested
from model_code.eval.metrics import evaluate, hits_to_run, qrels_dict, search_depth, write_trec_run
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.retrievers import Retriever, load_retriever, read_manifest

CURVE_CUTOFFS = [1, 2, 3, 5, 10, 20, 50, 100]


def run_retrieval(retriever: Retriever, data: IngestedData, split: str, k: int,
                  ignore_identical_ids: bool = True) -> dict[str, dict[str, float]]:
    qrels = qrels_dict(data.qrels_for(split))
    queries = data.queries[data.queries["query_id"].isin(qrels)]
    hits = retriever.search(queries["text"].tolist(), search_depth(k, ignore_identical_ids),
                            desc=f"searching {split} queries")
    return hits_to_run(queries["query_id"].tolist(), [h.doc_ids for h in hits], [h.scores for h in hits], k,
                       ignore_identical_ids)


def score(retriever: Retriever, data: IngestedData, settings: EvalParams) -> tuple[dict, pd.DataFrame, dict]:
    """(mean of each metric, per-query metrics, the run) of ``retriever`` on ``settings.split``:
    ``eval.metrics`` plus the recall curve's cutoffs. The same scoring serves the evaluate stage
    and the registration's re-evaluation of the champion."""
    ranking = run_retrieval(retriever, data, settings.split, settings.top_k, settings.ignore_identical_ids)
    qrels = qrels_dict(data.qrels_for(settings.split))
    curve_metrics = [f"recall@{k}" for k in CURVE_CUTOFFS if k <= settings.top_k]
    means, per_query = evaluate(qrels, ranking, sorted(set(settings.metrics) | set(curve_metrics)))
    return means, per_query, ranking


def run(params: Params, layout: Layout) -> dict:
    """Evaluate the retriever the index stage built (the one registration logs and serves)."""
    settings, data = params.eval, load_ingested(layout.ingested)
    kind = read_manifest(layout.retriever)["kind"]
    if kind != params.retriever.kind:
        raise ValueError(f"{layout.retriever} holds a {kind} retriever but retriever.kind is "
                         f"{params.retriever.kind}: run the index stage again")
    retriever = load_retriever(layout.retriever, layout.encoder)
    missing = set(data.corpus["doc_id"]) - set(retriever.live_ids())
    if missing:
        raise ValueError(f"the {kind} retriever in {layout.retriever} lacks {len(missing)} of the "
                         f"{len(data.corpus)} ingested documents (e.g. {min(missing)!r}); rebuild it over every "
                         "document")
    start = time.perf_counter()
    means, per_query, ranking = score(retriever, data, settings)
    metrics = {name: means[name] for name in settings.metrics}
    metrics.update(split=settings.split, queries=len(per_query), retriever=kind,
                   search_seconds=time.perf_counter() - start)
    curve_metrics = [m for m in means if m.startswith("recall@") and int(m.split("@")[1]) in CURVE_CUTOFFS]
    with atomic_path(layout.eval_report) as out:
        out.mkdir()
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        write_trec_run(out / "run.trec", ranking, "fresh-retriever")
        per_query.to_csv(out / "per_query.csv", index=False)
        curve = [{"k": int(m.split("@")[1]), "recall": means[m]} for m in curve_metrics]
        (out / "recall_curve.json").write_text(json.dumps(curve, indent=2) + "\n")
        _plot(metrics, settings.metrics, out / "metrics.png")
    return metrics


def _plot(metrics: dict, names: list[str], path) -> None:
    figure, axis = plt.subplots(figsize=(6, 3))
    axis.bar(names, [metrics[n] for n in names], color="#4c72b0")
    axis.set_ylim(0, 1)
    axis.set_title(f"retrieval quality ({metrics['split']}, {metrics['queries']} queries)")
    for i, name in enumerate(names):
        axis.text(i, metrics[name] + 0.02, f"{metrics[name]:.3f}", ha="center", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
