"""Stage 6, evaluation: retrieve top-k for the evaluation split and score it with ranx.

Outputs (``Layout.eval_report``): metrics.json (DVC metrics), run.trec, per_query.csv,
recall_curve.csv (DVC plot) and metrics.png.
"""

from __future__ import annotations

import json
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from model_code.config import EncoderParams, EvalParams
from model_code.data.ingested import IngestedData
from model_code.eval.metrics import evaluate, qrels_dict, write_trec_run
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.retriever import Retriever

CURVE_CUTOFFS = [1, 2, 3, 5, 10, 20, 50, 100]


def run_retrieval(retriever: Retriever, data: IngestedData, split: str, k: int) -> dict[str, dict[str, float]]:
    qrels = qrels_dict(data.qrels_for(split))
    queries = data.queries[data.queries["query_id"].isin(qrels)]
    hits = retriever.search(queries["text"].tolist(), k, desc=f"searching {split} queries")
    return {
        query_id: dict(zip(hit.doc_ids, hit.scores)) for query_id, hit in zip(queries["query_id"], hits)
    }


def run(params: EvalParams, encoder_params: EncoderParams, data: IngestedData, layout: Layout,
        kind: str = "dense") -> dict:
    """Evaluate the retriever a deployment of this workspace would serve (``freshness.retriever``)."""
    retriever = Retriever.load(layout.encoder, layout.searcher(kind), encoder_params, kind)
    missing = set(data.corpus["doc_id"]) - set(retriever.index.live_ids())
    if missing:
        raise ValueError(f"the {kind} retriever in {layout.root / 'models'} lacks {len(missing)} of the "
                         f"{len(data.corpus)} ingested documents (e.g. {min(missing)!r}); rebuild it"
                         + (" with incdsi.head_documents: all" if kind == "incdsi" else ""))
    start = time.perf_counter()
    ranking = run_retrieval(retriever, data, params.split, params.top_k)
    search_seconds = time.perf_counter() - start
    qrels = qrels_dict(data.qrels_for(params.split))
    curve_metrics = [f"recall@{k}" for k in CURVE_CUTOFFS if k <= params.top_k]
    means, per_query = evaluate(qrels, ranking, sorted(set(params.metrics) | set(curve_metrics)))
    metrics = {name: means[name] for name in params.metrics}
    metrics.update(split=params.split, queries=len(qrels), retriever=kind, search_seconds=search_seconds)
    with atomic_path(layout.eval_report) as out:
        out.mkdir()
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        write_trec_run(out / "run.trec", ranking, "fresh-retriever")
        per_query.to_csv(out / "per_query.csv", index=False)
        curve = [{"k": int(m.split("@")[1]), "recall": means[m]} for m in curve_metrics]
        (out / "recall_curve.json").write_text(json.dumps(curve, indent=2) + "\n")
        _plot(metrics, params.metrics, out / "metrics.png")
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
