"""Configurations that differ only in how the trained model is searched, trained once.

    python -m benchmarks.shared_training --data ../shared/data/scifact \\
        --configs svdr-full svdr-beta svdr-beta-rerank10 svdr-beta-rerank100 svdr-alpha

SVDR's search modes (issue #24) share everything up to the trained encoder: ``retriever.svdr.search``
and ``rerank_depth`` are read by the index and evaluate stages only (the train stage reads the loss,
top-k, vocabulary and negatives settings of ``retriever.svdr``, never the mode). Run one by one
with ``benchmarks.run``, the five configurations above would repeat the same 40-minute CPU training
five times. Here the first configuration runs the whole pipeline (``benchmarks.run.run_params``) and
every other one rebuilds only its index and evaluates it, in the same workspace.

The configurations must resolve to the same params except the keys in ``SEARCH_ONLY``; a difference
anywhere else (another loss, another seed) is refused by name before anything runs. Each
configuration gets the row ``benchmarks.run`` writes (``<out>/<dataset>/<config>.json`` and
``per_query/<config>.csv``, the same fields) plus ``harness: shared_training`` and ``trained_in``
(the configuration whose run trained the model); its ``timings`` are the shared stages' from that
run and its own index and evaluate stages'. Refused from uncommitted code unless ``--allow-dirty``,
as ``benchmarks.run``.
"""

from __future__ import annotations

import datetime as dt
import logging
import resource
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks.configs import PIPELINE_CONFIGS, resolve_params
from benchmarks.harness import beir_directory, configurations_parser
from benchmarks.provenance import params_drift
from benchmarks.report import write_results_table
from benchmarks.run import METRICS, checked_commit, machine, run_params
from model_code.config import Params
from model_code.io import atomic_path, tree_sha256, write_json
from model_code.layout import Layout
from model_code.stages.pipeline import STAGES

SEARCH_ONLY = frozenset({"retriever.svdr.search", "retriever.svdr.rerank_depth"})
REBUILT = ("index", "evaluate")  # the stages after training, which read SEARCH_ONLY


def training_differences(params: dict[str, Params]) -> dict[str, list[str]]:
    """Per configuration after the first, the params keys outside ``SEARCH_ONLY`` (dotted; the
    data directory aside) on which it differs from the first: what training could depend on."""
    (_, first), *rest = params.items()
    base = first.model_dump(mode="json")
    differences = {name: [key for key in params_drift(p.model_dump(mode="json"), base) if key not in SEARCH_ONLY]
                   for name, p in rest}
    return {name: keys for name, keys in differences.items() if keys}


def run_shared(params: dict[str, Params], workdir: Path) -> dict[str, tuple]:
    """Per configuration, what ``run_params`` returns for it (metrics, stage timings, training
    summary, per-query metrics, resolved params): the first runs every stage in ``workdir``, the
    others their ``REBUILT`` stages over its trained model."""
    (first, first_params), *rest = params.items()
    results = {first: run_params(first_params, workdir)}
    shared_timings = {stage: seconds for stage, seconds in results[first][1].items() if stage not in REBUILT}
    layout = Layout(workdir)
    for name, settings in rest:
        timings = dict(shared_timings)
        for stage in (s for s in STAGES if s.name in REBUILT):
            start = time.perf_counter()
            metrics = stage.runner()(settings, layout)  # the evaluate stage's, the last one
            timings[stage.name] = time.perf_counter() - start
        per_query = pd.read_csv(layout.eval_report / "per_query.csv", dtype={"query_id": str})
        results[name] = ({k: metrics[k] for k in METRICS}, timings, results[first][2], per_query[["query_id", *METRICS]],
                         settings.model_dump(mode="json"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = configurations_parser("benchmarks.shared_training", __doc__,
                                   "configurations differing only in SEARCH_ONLY keys; the first one trains")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data = beir_directory(parser, args.data)
    if len(set(args.configs)) != len(args.configs):
        parser.error("--configs: each configuration once")
    params = {config: resolve_params(PIPELINE_CONFIGS[config], data) for config in args.configs}
    if differing := training_differences(params):
        config, keys = next(iter(differing.items()))
        parser.error(f"{config} differs from {args.configs[0]} in {', '.join(keys)}, not only in how it searches "
                     f"({', '.join(sorted(SEARCH_ONLY))}): it needs a training run of its own (benchmarks.run)")
    commit = checked_commit(parser, args.out, args.allow_dirty)
    dataset, sha = data.name, tree_sha256(data)
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as workdir:
        results = run_shared(params, Path(workdir))
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(f"\n{dataset}: trained once in {args.configs[0]}")
    for config, (metrics, timings, training, per_query, resolved) in results.items():
        write_json(args.out / dataset / f"{config}.json", {
            "dataset": dataset, "config": config, "metrics": metrics,
            "timings": {**timings, "total": sum(timings.values())}, "training": training,
            "peak_rss_mb": round(peak / 1024, 1), "machine": machine(), "date": dt.date.today().isoformat(),
            "commit": commit, "dirty": commit.endswith("+dirty"), "params": resolved, "dataset_sha256": sha,
            "harness": "shared_training", "trained_in": args.configs[0],
        })
        with atomic_path(args.out / dataset / "per_query" / f"{config}.csv") as tmp:
            per_query.round(6).to_csv(tmp, index=False)
        print(f"  {config:<24} " + "  ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
    write_results_table(args.out, args.out.parent / "RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
