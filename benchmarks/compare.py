"""Paired comparison of benchmark configurations on the same test queries.

    python -m benchmarks.compare --dataset scifact ct-long hce-j-long hce-j-long-hw01
    python -m benchmarks.compare --dataset scifact ct-long+ct-long-seed1 hce-j-long-hw01+hce-j-long-hw01-seed1
    python -m benchmarks.compare --dataset scifact ct-long-leafneg-suponly sweeps/hce-j-vs-leafneg/winner-seed0

Compares every configuration after the first against the first (the baseline), query by query,
from ``benchmarks/results/<dataset>/per_query/<config>.csv`` (written by ``benchmarks.run``), or a
sweep's test run named ``sweeps/<sweep>/<run>`` (``sweeps/<sweep>/<run>.csv``, written by
``benchmarks.sweep``: its winner's and baseline's seeds, compared with rows measured later by the
same code without running them again). One
run's mean says little when two configurations are a point apart on 300 queries; the paired
difference, its bootstrap confidence interval and a sign-flip permutation test say whether the gap
is larger than the query-to-query noise. Runs joined with ``+`` (a configuration and its seed
reruns) are averaged query by query first, so training noise is averaged out before queries are
compared. Prints a table and writes
``benchmarks/results/<dataset>/comparisons/<baseline>.<metric>.json`` (a sweep run's ``/`` written
as ``.``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from benchmarks.harness import RESULTS
from benchmarks.run import code_version
from model_code.io import write_json

SWEEP_RUN = "sweeps/"  # a run named sweeps/<sweep>/<run>: one of that sweep's test runs


def run_files(results: Path, dataset: str, name: str) -> tuple[Path, Path, str]:
    """(its per-query scores, the results file naming its commit, the command that measures it) of
    a compared run: a ``benchmarks.run`` configuration, or a sweep's test run ``sweeps/<sweep>/<run>``
    (recorded in the sweep's file)."""
    folder = results / dataset
    if name.startswith(SWEEP_RUN):
        return folder / f"{name}.csv", folder / f"{name.rsplit('/', 1)[0]}.json", "python -m benchmarks.sweep"
    return folder / "per_query" / f"{name}.csv", folder / f"{name}.json", f"python -m benchmarks.run --config {name}"


def load_per_query(results: Path, dataset: str, config: str) -> pd.DataFrame:
    path, _, measure = run_files(results, dataset, config)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no per-query scores for {config!r}; measure it with {measure}")
    return pd.read_csv(path, dtype={"query_id": str}).set_index("query_id").sort_index()


def load_metric(results: Path, dataset: str, runs: str, metric: str) -> pd.Series:
    """Per-query ``metric`` of ``runs`` (configurations joined by ``+``: their query-by-query mean)."""
    configs = runs.split("+")
    frames = [load_per_query(results, dataset, config) for config in configs]
    if missing := [c for c, f in zip(configs, frames) if metric not in f.columns]:
        raise ValueError(f"no {metric!r} in the per-query scores of {', '.join(missing)}; "
                         f"measured: {', '.join(frames[0].columns)}")
    if any(set(f.index) != set(frames[0].index) for f in frames):
        raise ValueError(f"the runs in {runs!r} scored different queries: average runs of the same dataset and split")
    return pd.concat([f[metric] for f in frames], axis=1).mean(axis=1)


def paired_difference(baseline: pd.Series, other: pd.Series, resamples: int = 10_000, seed: int = 0) -> dict:
    """Mean of ``other - baseline`` over the same queries, its 95% bootstrap interval, the two-sided
    p-value of a paired sign-flip permutation test, and how many queries went up, stayed, went down."""
    if set(baseline.index) != set(other.index):
        raise ValueError(f"the runs scored different queries ({len(baseline)} vs {len(other)}): "
                         "compare runs of the same dataset and split")
    a, b = baseline.to_numpy(float), other.loc[baseline.index].to_numpy(float)
    diff = b - a
    if np.all(diff == diff[0]):  # every resample has the same mean (scipy's BCa interval would be NaN)
        low = high = diff[0]
    else:
        low, high = stats.bootstrap((diff,), np.mean, n_resamples=resamples, random_state=seed).confidence_interval
    test = stats.permutation_test((a, b), lambda x, y: np.mean(y - x), permutation_type="samples",
                                  n_resamples=resamples, random_state=seed)
    return {
        "baseline": float(a.mean()), "other": float(b.mean()), "difference": float(diff.mean()),
        "ci95": [float(low), float(high)], "p_value": float(test.pvalue),
        "better": int((diff > 0).sum()), "same": int((diff == 0).sum()), "worse": int((diff < 0).sum()),
    }


def _sources(results: Path, dataset: str, configs: list[str]) -> dict[str, str | None]:
    """The commit each compared run measured (``a+b``: every run), from its results file."""
    names = [name for config in configs for name in config.split("+")]
    files = {name: run_files(results, dataset, name)[1] for name in names}
    return {name: json.loads(file.read_text()).get("commit") if file.exists() else None for name, file in files.items()}


def _p(value: float) -> str:
    """A permutation test cannot resolve p below 1 / resamples: say so instead of printing 0.000."""
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="results sub-directory, e.g. scifact")
    parser.add_argument("baseline", help="configuration the others are compared against (A+B: mean of runs)")
    parser.add_argument("others", nargs="+", help="configurations to compare (A+B: mean of runs)")
    parser.add_argument("--metric", default="ndcg@10")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        base = load_metric(args.results, args.dataset, args.baseline, args.metric)
        rows = {c: paired_difference(base, load_metric(args.results, args.dataset, c, args.metric)) for c in args.others}
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    print(f"\n{args.dataset}: {args.metric} against {args.baseline} ({base.mean():.4f}, {len(base)} queries)")
    print(f"| config | {args.metric} | difference | 95% CI | p (paired) | better / same / worse |")
    print("|---|---|---|---|---|---|")
    for config, r in rows.items():
        print(f"| {config} | {r['other']:.4f} | {r['difference']:+.4f} | [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}] | "
              f"{_p(r['p_value'])} | {r['better']} / {r['same']} / {r['worse']} |")
    write_json(args.results / args.dataset / "comparisons" / f"{args.baseline.replace('/', '.')}.{args.metric}.json",
               {"dataset": args.dataset, "metric": args.metric, "baseline": args.baseline, "comparisons": rows,
                "commit": code_version(results=args.results),  # the code that compared, not what was measured
                "sources": _sources(args.results, args.dataset, [args.baseline, *args.others])})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
