"""Choose a configuration's settings on dev, then measure the choice on test against a baseline.

    python -m benchmarks.sweep --data DIR --name bm25-k1 --base bm25 --baseline bm25 \\
        --grid 'retriever.bm25.k1=[0.9, 1.2, 1.5]' --grid 'retriever.bm25.b=[0.5, 0.75]' --seeds 3

1. **Selection, on dev only.** Every variant of the grid (the ``--base`` configuration with one value
   per ``--grid`` key, plus the ``--set`` overrides every run gets) runs the pipeline with
   ``eval.split: dev`` (the dev split carved from train, or the dataset's own) on a view of the
   dataset without its test qrels, so nothing in selection can read them. The variant with the
   highest dev ``--metric`` wins; a tie goes to the earlier variant in grid order.
2. **Test, once per seed.** The winner runs on the whole dataset with ``eval.split: test`` for seeds
   0..N-1 (seed 0: the chosen params as they are; seed s: ``querygen``, ``hierarchy`` and ``train``
   seeds set to s, as ``configs.seed_overrides`` does), and so does the ``--baseline`` configuration,
   unless ``benchmarks/results/<dataset>/<baseline>[-seed<s>].json`` already measured exactly those
   params on the same data at the current commit (then its per-query file is used).
3. **Paired comparison** (``benchmarks.compare.paired_difference``): each side's per-query metric
   averaged over the seeds, then winner minus baseline over the test queries: mean difference,
   95 % bootstrap interval, paired permutation p-value.

**Resuming.** Every finished run is kept at once in ``sweeps/<name>/runs/`` (its record) and
``sweeps/<name>/`` (a test run's per-query metrics), so a sweep stopped half-way (a session's end,
a preempted machine) is started again with the same command and skips what it already ran: a run is
reused only when it ran the same resolved params on the same data (content hash) at the same clean
commit on the same accelerator (``benchmarks.run.accelerator``: a CPU's fp32 and a GPU's bf16 are not
one measurement). ``timings`` add up the runs' own seconds, whichever sitting ran them. A sweep too long for one sitting is run from a worktree at one commit, one part per sitting.

Writes ``benchmarks/results/<dataset>/sweeps/<name>.json`` (the grid, every variant's dev metrics,
how many variants were tried, the winner, each test run, the comparison, the commit, the resolved
params of winner and baseline, the dataset's content hash) and the test runs' per-query metrics in
``benchmarks/results/<dataset>/sweeps/<name>/``, then regenerates ``RESULTS.md``. Like
``benchmarks.run``, it refuses to write into ``benchmarks/results/`` from uncommitted code unless
``--allow-dirty``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from benchmarks.compare import paired_difference
from benchmarks.configs import CONFIGS, PIPELINE_CONFIGS, resolve_params, seed_overrides
from benchmarks.harness import beir_directory, results_arguments
from benchmarks.provenance import changed_dependencies
from benchmarks.report import write_results_table
from benchmarks.run import METRICS, accelerator, checked_commit, machine, run_params
from model_code.config import Params, deep_merge
from model_code.io import atomic_path, tree_sha256, write_json

REPORTED_SPLIT = "test"
log = logging.getLogger("benchmarks.sweep")


def assignment(text: str) -> tuple[str, Any]:
    """``section.key=value`` with a YAML value (``1.5``, ``null``, ``english``, ``[a, b]``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r}: expected KEY=VALUE, e.g. retriever.bm25.k1=1.2")
    return key.strip(), yaml.safe_load(value)


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` as ``{"a": {"b": 1}}`` (params overrides)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, last = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    return out


def variants(grid: dict[str, list]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first key varying slowest."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def overrides(config: str, fixed: dict[str, Any], variant: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """What a run applies to ``params.yaml``: the named configuration, the sweep's fixed overrides,
    the variant's values, the seed."""
    merged = PIPELINE_CONFIGS[config]
    for update in (nested(fixed), nested(variant), seed_overrides(seed)):
        merged = deep_merge(merged, update)
    return merged


def selection_view(data_dir: Path, into: Path) -> Path:
    """``data_dir`` (BEIR) as links in ``into/<name>`` without the reported split's qrels."""
    view = into / data_dir.name
    view.mkdir(parents=True)
    for entry in sorted(data_dir.iterdir()):
        if entry.name == "qrels" and entry.is_dir():
            (view / "qrels").mkdir()
            for file in sorted(entry.iterdir()):
                if file.name.split(".")[0] != REPORTED_SPLIT:
                    (view / "qrels" / file.name).symlink_to(file.resolve())
        else:
            (view / entry.name).symlink_to(entry.resolve())
    return view


class FinishedRuns:
    """The runs a sweep has finished, kept so that starting it again skips them: ``runs/<key>.json``
    (the record, with the resolved params, data hash and commit it ran at) and, for a test run,
    ``<key>.csv`` (its per-query metrics) under ``directory``. Nothing is reused or kept from
    uncommitted code, whose commit does not say what ran, nor across accelerators."""

    def __init__(self, directory: Path, commit: str, sha: str):
        self.directory, self.commit, self.sha = directory, commit, sha
        self.enabled = not commit.endswith("+dirty")

    def _identity(self, params: Params) -> dict:
        return {"commit": self.commit, "dataset_sha256": self.sha, "accelerator": accelerator(),
                "params": _without_path(params.model_dump(mode="json"))}

    def get(self, key: str, params: Params) -> tuple[dict, pd.DataFrame | None] | None:
        """(the record, its per-query metrics or None) of ``key`` when it ran exactly ``params`` here."""
        record_file = self.directory / "runs" / f"{key}.json"
        if not self.enabled or not record_file.exists():
            return None
        record = json.loads(record_file.read_text())
        identity = self._identity(params)
        if {k: record.get(k) for k in identity} != identity:
            return None
        if not record.get("per_query"):
            return record, None
        per_query = self.directory / f"{key}.csv"
        return (record, pd.read_csv(per_query, dtype={"query_id": str})) if per_query.exists() else None

    def put(self, key: str, params: Params, record: dict, per_query: pd.DataFrame | None = None) -> None:
        """Keep a finished run: a test run's per-query file is the sweep's output ``<key>.csv`` in
        any case, its record only from committed code."""
        if per_query is not None:
            write_per_query(self.directory / f"{key}.csv", per_query)
        if self.enabled:
            write_json(self.directory / "runs" / f"{key}.json",
                       {**record, **self._identity(params), "per_query": per_query is not None})


def write_per_query(path: Path, per_query: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        per_query[["query_id", *METRICS]].round(6).to_csv(tmp, index=False)


def select(base: str, fixed: dict, grid: dict[str, list], data_dir: Path, metric: str, workroot: Path,
           finished: FinishedRuns) -> list[dict]:
    """Every variant's dev metrics (a run on the dev split of a dataset view without test qrels);
    the winner is the first variant with the highest ``metric``."""
    view = selection_view(data_dir, workroot / "view")
    rows, grid_variants = [], variants(grid)
    for number, variant in enumerate(grid_variants):
        params = resolve_params(deep_merge(overrides(base, fixed, variant), {"eval": {"split": "dev"}}), view)
        if (done := finished.get(f"dev-{number}", params)) is not None:
            row = done[0]["row"]
        else:
            with tempfile.TemporaryDirectory(prefix=f"sweep-{number}-", dir=workroot) as workdir:
                start = time.perf_counter()
                metrics, _, training, per_query, _ = run_params(params, Path(workdir))
            row = {"params": variant, "dev": metrics, "dev_queries": len(per_query),
                   "seconds": round(time.perf_counter() - start, 1),
                   "dev_best_in_training": (training or {}).get("dev_best")}
            finished.put(f"dev-{number}", params, {"row": row})
        rows.append(row)
        log.info("variant %d/%d %s: dev %s %.4f%s", number + 1, len(grid_variants), variant, metric,
                 row["dev"][metric], "" if done is None else " (finished earlier)")
    return rows


def winner_index(rows: list[dict], metric: str) -> int:
    best = max(row["dev"][metric] for row in rows)
    return next(i for i, row in enumerate(rows) if row["dev"][metric] == best)


def _without_path(params: dict) -> dict:
    return {**params, "data": {k: v for k, v in params.get("data", {}).items() if k != "path"}}


def _same_params(a: dict, b: dict) -> bool:
    """The same resolved params, wherever the data directory was."""
    return _without_path(a) == _without_path(b)


def measured(results: Path, dataset: str, config: str, seed: int, params: dict, sha: str,
             commit: str) -> tuple[str, pd.DataFrame] | None:
    """(its file name, its per-query metrics) of a ``benchmarks.run`` row that measured exactly
    ``params`` on the same data and accelerator from a clean commit whose code the run depends on
    is unchanged at the current, clean ``commit``; None when there is no such row."""
    name = config if seed == 0 else f"{config}-seed{seed}"
    row_file, per_query = results / dataset / f"{name}.json", results / dataset / "per_query" / f"{name}.csv"
    if commit.endswith("+dirty") or not row_file.exists() or not per_query.exists():
        return None
    row = json.loads(row_file.read_text())
    recorded, row_commit = row.get("params"), row.get("commit") or "+dirty"
    if (recorded is None or row_commit.endswith("+dirty") or row.get("dataset_sha256") != sha
            or (row.get("machine") or "").rpartition(", ")[2] != accelerator() or not _same_params(recorded, params)):
        return None
    if changed_dependencies(row_commit, "run", recorded) != []:  # None: not in history
        return None
    return f"{name}.json", pd.read_csv(per_query, dtype={"query_id": str})


def reported_runs(side: str, config: str, fixed: dict, variant: dict, seeds: int, data_dir: Path, workroot: Path,
                  finished: FinishedRuns, reuse: dict | None = None, ran: list[dict] = ()) -> list[dict]:
    """One test run per seed of the sweep's ``side`` (winner or baseline); ``reuse``: results,
    dataset, sha, commit to look for measured ``benchmarks.run`` rows; ``ran``: the winner's runs,
    taken for the baseline's where they ran the same params (a dev winner that is the baseline
    itself costs its test runs once, and the comparison is exactly zero)."""
    runs = []
    for seed in range(seeds):
        params = resolve_params(deep_merge(overrides(config, fixed, variant, seed), {"eval": {"split": REPORTED_SPLIT}}),
                                data_dir)
        resolved = params.model_dump(mode="json")
        if (same := next((r for r in ran if r["seed"] == seed and _same_params(r["params"], resolved)), None)):
            runs.append({**same, "source": "the winner's run (the same params)", "seconds": None})  # counted once
            continue
        found = measured(**reuse, config=config, seed=seed, params=resolved) if reuse else None
        if found is not None:
            source, per_query = found
            runs.append({"seed": seed, "source": f"measured: {source}", "per_query": per_query,
                         "metrics": {m: float(per_query[m].mean()) for m in METRICS}, "params": resolved})
            continue
        if (done := finished.get(f"{side}-seed{seed}", params)) is not None:
            runs.append({"seed": seed, "source": "run by this sweep", "per_query": done[1],
                         "metrics": done[0]["metrics"], "seconds": done[0].get("seconds"), "params": resolved})
            continue
        with tempfile.TemporaryDirectory(prefix=f"sweep-test-{seed}-", dir=workroot) as workdir:
            start = time.perf_counter()
            metrics, _, _, per_query, _ = run_params(params, Path(workdir))
        seconds = round(time.perf_counter() - start, 1)
        finished.put(f"{side}-seed{seed}", params, {"metrics": metrics, "seconds": seconds}, per_query)
        runs.append({"seed": seed, "source": "run by this sweep", "per_query": per_query, "metrics": metrics,
                     "seconds": seconds, "params": resolved})
    return runs


def run_seconds(rows: list[dict], runs: list[dict], this_sitting: float) -> dict[str, float]:
    """Seconds the sweep's own runs took, summed over every sitting that ran one (dev selection,
    test runs), their sum (``total``) and the wall time of this sitting alone; runs reused from
    ``benchmarks.run`` rows or from the winner (or kept before runs recorded their seconds) count nothing."""
    def summed(values):
        return round(sum(v for v in values if v is not None), 1)

    selection, test = summed(row.get("seconds") for row in rows), summed(run.get("seconds") for run in runs)
    return {"selection": selection, "test": test, "total": round(selection + test, 1),
            "this_sitting": round(this_sitting, 1)}


def seed_mean(runs: list[dict], metric: str) -> pd.Series:
    """Per-query ``metric`` averaged over the runs (as ``compare.load_metric`` does for ``a+b``)."""
    frames = [run["per_query"].set_index("query_id")[metric] for run in runs]
    return pd.concat(frames, axis=1).mean(axis=1).sort_index()


def expected_params(row: dict) -> list[tuple[dict | None, dict]]:
    """(overrides the sweep's winner and baseline resolve from now, the params it recorded): the
    provenance check of a sweep row. None when a configuration no longer exists."""
    pairs = []
    for side, config, variant in (("winner", row["base"], row["winner"]["params"]), ("baseline", row["baseline"], {})):
        recorded = row["params"][side]
        now = (deep_merge(overrides(config, row["fixed"], variant), {"eval": {"split": REPORTED_SPLIT}})
               if config in PIPELINE_CONFIGS else None)
        pairs.append((now, recorded))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="BEIR directory")
    parser.add_argument("--name", required=True, help="the sweep's name: sweeps/<name>.json")
    parser.add_argument("--base", required=True, choices=CONFIGS, help="configuration the grid varies")
    parser.add_argument("--baseline", required=True, choices=CONFIGS, help="configuration the winner is compared with")
    parser.add_argument("--grid", action="append", required=True, metavar="KEY=[V1, V2]",
                        help="a params key and the YAML list of its values (repeat for more keys)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="fixed",
                        help="an override every run gets, variants and baseline alike (repeatable)")
    parser.add_argument("--seeds", type=int, default=3, help="test runs of the winner and the baseline")
    parser.add_argument("--metric", default="ndcg@10", choices=METRICS, help="selection and comparison metric")
    results_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        grid = dict(assignment(text) for text in args.grid)
        fixed = dict(assignment(text) for text in args.fixed)
    except ValueError as error:
        parser.error(str(error))
    if bad := [key for key, values in grid.items() if not isinstance(values, list) or not values]:
        parser.error(f"--grid {bad[0]}: give a non-empty YAML list of values, e.g. {bad[0]}=[1, 2]")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    data = beir_directory(parser, args.data)
    if not (data / "qrels" / f"{REPORTED_SPLIT}.tsv").exists():
        parser.error(f"{args.data} has no qrels/{REPORTED_SPLIT}.tsv: nothing to report the winner on")
    for config, variant in [(args.base, v) for v in variants(grid)] + [(args.baseline, {})]:
        try:  # every run's params are valid before anything runs
            resolve_params(overrides(config, fixed, variant), data)
        except ValueError as error:
            parser.error(f"{config} with {variant or fixed}: {error}")
    commit = checked_commit(parser, args.out, args.allow_dirty)
    dataset = data.name
    started = time.perf_counter()
    sha = tree_sha256(data)
    sweep_dir = args.out / dataset / "sweeps"
    finished = FinishedRuns(sweep_dir / args.name, commit, sha)
    with tempfile.TemporaryDirectory(prefix=f"sweep-{args.name}-") as workroot:
        rows = select(args.base, fixed, grid, data, args.metric, Path(workroot), finished)
        best = winner_index(rows, args.metric)
        winner = reported_runs("winner", args.base, fixed, rows[best]["params"], args.seeds, data, Path(workroot),
                               finished)
        baseline = reported_runs("baseline", args.baseline, fixed, {}, args.seeds, data, Path(workroot), finished,
                                 reuse={"results": args.out, "dataset": dataset, "sha": sha, "commit": commit},
                                 ran=winner)
    comparison = paired_difference(seed_mean(baseline, args.metric), seed_mean(winner, args.metric))
    for run in baseline:  # the baseline's own runs wrote theirs as they finished
        if run["source"] != "run by this sweep":
            write_per_query(sweep_dir / args.name / f"baseline-seed{run['seed']}.csv", run["per_query"])
    result = {
        "dataset": dataset, "name": args.name, "base": args.base, "baseline": args.baseline, "metric": args.metric,
        "grid": grid, "fixed": fixed,
        "selection": {"split": "dev", "metric": args.metric, "test_qrels_hidden": True,
                      "tie_break": "first variant in grid order"},
        "variants_tried": len(rows), "variants": rows,
        "winner": {"index": best, "params": rows[best]["params"], "dev": rows[best]["dev"][args.metric]},
        "seeds": list(range(args.seeds)),
        "test": {side: [{"seed": r["seed"], "source": r["source"], "metrics": r["metrics"], "seconds": r.get("seconds")}
                       for r in runs] for side, runs in (("winner", winner), ("baseline", baseline))},
        "comparison": {"metric": args.metric, "split": REPORTED_SPLIT, "queries": len(seed_mean(winner, args.metric)),
                       **comparison},
        "timings": run_seconds(rows, winner + baseline, time.perf_counter() - started),
        "machine": machine(), "date": dt.date.today().isoformat(),
        "commit": commit, "dirty": commit.endswith("+dirty"),
        "params": {"winner": winner[0]["params"], "baseline": baseline[0]["params"]},
        "dataset_sha256": sha,
    }
    write_json(sweep_dir / f"{args.name}.json", result)
    c = comparison
    print(f"\n{dataset} / sweep {args.name}: {len(rows)} variants of {args.base} tried on dev")
    for number, row in enumerate(rows):
        print(f"  {'*' if number == best else ' '} {row['params']}  dev {args.metric} {row['dev'][args.metric]:.4f}")
    print(f"test {args.metric} over {args.seeds} seed(s): winner {c['other']:.4f}, {args.baseline} {c['baseline']:.4f}, "
          f"difference {c['difference']:+.4f} (95% CI {c['ci95'][0]:+.4f} to {c['ci95'][1]:+.4f}, p = {c['p_value']:.3f})")
    write_results_table(args.out, args.out.parent / "RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
