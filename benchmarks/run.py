"""Run a named benchmark configuration on a BEIR directory and record the result.

    python -m benchmarks.run --data ../shared/data/scifact --config bm25

Writes ``benchmarks/results/<dataset>/<config>.json`` ({dataset, config, metrics, timings,
training, peak_rss_mb, machine, date, commit, params, dataset_sha256}: the fully resolved params
and the dataset's content hash make a row reproducible from its commit) and each test query's
metrics to
``benchmarks/results/<dataset>/per_query/<config>.csv`` (for paired comparisons:
``python -m benchmarks.compare``), prints a table and regenerates ``RESULTS.md`` beside the results
directory (``benchmarks/RESULTS.md`` by default). Results files are written by this code only,
and it refuses to write into ``benchmarks/results/`` from a tree with uncommitted code changes
(``--allow-dirty`` writes anyway and marks the row ``dirty``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks.configs import CONFIGS, PIPELINE_CONFIGS, resolve_params
from benchmarks.harness import RESULTS, beir_directory, results_arguments
from benchmarks.report import write_results_table
from model_code.config import Params
from model_code.io import atomic_path, tree_sha256, write_json
from model_code.layout import Layout
from model_code.stages.pipeline import STAGES

PROJECT = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "recall@1", "recall@5", "recall@10", "recall@100", "mrr@10"]


def machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or platform.machine(),
    ) if Path("/proc/cpuinfo").exists() else platform.machine()
    return f"{os.cpu_count()}-core {model}, {accelerator()}"


def accelerator() -> str:
    """The GPU a run computes on, or "no GPU" (the end of ``machine()``): runs on different
    accelerators (fp32 on a CPU, bf16 autocast on a GPU) are not the same measurement."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def code_version(root: Path = PROJECT, results: Path | None = None) -> str:
    """The commit the measured code came from, ``+dirty`` when tracked files other than results had
    uncommitted changes: a result stays attributable after the code it measured has changed (a
    previous run's fresh results files, wherever ``--out`` put them, and archived ones beside them
    are not a code change)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False).stdout.strip()

    root = root.resolve()
    folders = {root / "benchmarks" / "results", (results or root / "benchmarks" / "results").resolve()}
    excluded = [f":(exclude){p.relative_to(root)}" for folder in folders
                for p in (folder, folder.parent / "RESULTS.md", folder.parent / "archive")
                if p.is_relative_to(root)]
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded)
    return commit + ("+dirty" if changed else "")


def checked_commit(parser: argparse.ArgumentParser, out: Path, allow_dirty: bool) -> str:
    """The commit a harness records (taken before it runs: the code is imported now, whatever is
    committed later); a usage error when uncommitted code would write into ``benchmarks/results/``
    without ``--allow-dirty``. Every harness writing results calls it."""
    commit = code_version(results=out)
    published = out.resolve() == RESULTS.resolve()
    if commit.endswith("+dirty") and published and not allow_dirty:
        parser.error("uncommitted code changes: commit them first, so that the results name the code they "
                     "measured (or pass --allow-dirty, which marks them dirty)")
    return commit


def run_pipeline(config: str, data_dir: Path, workdir: Path) -> tuple[dict, dict, dict | None, pd.DataFrame, dict]:
    return run_params(resolve_params(PIPELINE_CONFIGS[config], data_dir), workdir)


def run_params(params: Params, workdir: Path) -> tuple[dict, dict, dict | None, pd.DataFrame, dict]:
    """Run the pipeline's stages with ``params`` in ``workdir``: (metrics on ``eval.split``, stage
    timings, training summary or None, per-query metrics, the resolved params)."""
    layout = Layout(workdir)
    timings = {}
    skipped = set() if params.train.enabled else {"querygen", "cluster"}  # zero-shot needs neither
    for stage in STAGES:
        if stage.command != "fresh-retriever" or stage.name in skipped:
            continue
        start = time.perf_counter()
        result = stage.runner()(params, layout)
        timings[stage.name] = time.perf_counter() - start
    metrics = result  # the evaluate stage's, the last one
    training = json.loads((layout.train_report / "metrics.json").read_text())
    if training.get("used") is False:  # a retriever kind without an encoder
        training = None
    else:  # examples/s counts the optimisation steps only (not the dev scoring and re-clustering between rounds)
        kept = ("steps", "examples_per_second", "seconds", "dev_best", "rounds", "best_step", "dev_scores")
        training = {k: training.get(k) for k in kept}
        if training["steps"]:
            training["loss_parts"] = loss_parts(pd.read_csv(layout.train_report / "steps.csv"))
    per_query = pd.read_csv(layout.eval_report / "per_query.csv", dtype={"query_id": str})
    return ({k: metrics[k] for k in METRICS}, timings, training, per_query[["query_id", *METRICS]],
            params.model_dump(mode="json"))


def loss_parts(steps: pd.DataFrame, window: int = 10) -> dict[str, list[float]]:
    """Each logged loss part's mean over the first and the last ``window`` steps: enough to see
    which terms of a loss fell and which dominate, without keeping the per-step log."""
    parts = steps.drop(columns=["step", "lr"])
    return {name: [round(float(col.head(window).mean()), 4), round(float(col.tail(window).mean()), 4)]
            for name, col in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__)
    parser.add_argument("--data", required=True, type=Path, help="BEIR directory")
    parser.add_argument("--config", required=True, choices=CONFIGS)
    results_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.data = beir_directory(parser, args.data)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.config}-") as workdir:
        metrics, timings, training, per_query, params = run_pipeline(args.config, args.data.resolve(), Path(workdir))
    dataset = args.data.resolve().name
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    result = {
        "dataset": dataset,
        "config": args.config,
        "metrics": metrics,
        "timings": {**timings, "total": sum(timings.values())},
        "training": training,
        "peak_rss_mb": round(peak / 1024, 1),
        "machine": machine(),
        "date": dt.date.today().isoformat(),
        "commit": commit,
        "dirty": commit.endswith("+dirty"),
        "params": params,
        "dataset_sha256": tree_sha256(args.data.resolve()),
    }
    write_json(args.out / dataset / f"{args.config}.json", result)
    with atomic_path(args.out / dataset / "per_query" / f"{args.config}.csv") as tmp:
        per_query.round(6).to_csv(tmp, index=False)
    print(f"\n{dataset} / {args.config}")
    for name, value in metrics.items():
        print(f"  {name:<12} {value:.4f}")
    print(f"  {'seconds':<12} {result['timings']['total']:.1f}   peak RSS {result['peak_rss_mb']} MB")
    write_results_table(args.out, args.out.parent / "RESULTS.md")  # default: benchmarks/RESULTS.md
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
