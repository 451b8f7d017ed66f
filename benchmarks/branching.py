"""Branching-factor sweep for HCE-J (HCE paper Fig. 4 analogue).

    python -m benchmarks.branching --data ../shared/data/scifact [--only-plot]

Runs every ``hce-j-b<b>`` configuration (``benchmarks/configs/hce-j-b<b>.yaml``:
``hce-j-no-cotrain`` with ``hierarchy.branching: b``; the b swept are the files there) whose
results file is missing, through ``benchmarks.run``, then plots test nDCG@10 and Recall@100 against
b from the results files into ``branching.png`` beside them and writes ``branching.json`` (one row
per b). At the b that ``branching: auto`` picks for the corpus (32 on SciFact), an existing
``hce-j-no-cotrain`` result is the point: the same configuration. Each run costs as much as
``hce-j-no-cotrain`` (30-45 min on 2 CPU cores), so ``--only-plot`` redraws from whatever has been
measured.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks import run
from benchmarks.configs import BRANCHING_SWEEP
from benchmarks.harness import results_arguments
from model_code.hierarchy.tree import auto_branching
from model_code.io import write_json

PROJECT = Path(__file__).resolve().parents[1]


def auto_point(data: Path) -> int | None:
    """The b that ``branching: auto`` picks for this BEIR corpus (None when it is not on disk)."""
    corpus = data / "corpus.jsonl"
    if not corpus.is_file():
        return None
    with corpus.open() as lines:
        return auto_branching(sum(1 for line in lines if line.strip()))


def result_file(results: Path, branching: int, auto: int | None = None) -> Path:
    """``hce-j-b<b>.json``; at the b ``branching: auto`` picks, ``hce-j-no-cotrain.json`` stands in
    when that is all there is: it is the same configuration, so the point is not run twice."""
    swept = results / f"hce-j-b{branching}.json"
    same = results / "hce-j-no-cotrain.json"
    return same if branching == auto and not swept.exists() and same.exists() else swept


def sweep_rows(results: Path, auto: int | None = None) -> list[dict]:
    """One row per measured branching factor, in sweep order."""
    rows = []
    for b in BRANCHING_SWEEP:
        path = result_file(results, b, auto)
        if path.exists():
            result = json.loads(path.read_text())
            rows.append({"branching": b, "config": result["config"], "commit": result.get("commit"),
                         "params": result.get("params"),
                         **{k: result["metrics"][k] for k in ("ndcg@10", "recall@100")},
                         "seconds": result["timings"]["total"], "machine": result["machine"], "date": result["date"]})
    return rows


def plot(rows: list[dict], target: Path) -> None:
    figure, axis = plt.subplots(figsize=(5, 3))
    for metric in ("ndcg@10", "recall@100"):
        axis.plot([r["branching"] for r in rows], [r[metric] for r in rows], marker="o", label=metric)
    axis.set(xscale="log", xlim=(3, 80), xlabel="branching factor b", ylabel="test score", title="HCE-J vs branching factor")
    axis.set_xticks(BRANCHING_SWEEP, [str(b) for b in BRANCHING_SWEEP])
    axis.minorticks_off()  # the log axis' minor labels (6x10^0, ...) would overprint the sweep's
    axis.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.branching", description=__doc__)
    parser.add_argument("--data", required=True, type=Path, help="BEIR directory")
    results_arguments(parser)
    parser.add_argument("--only-plot", action="store_true", help="do not run missing configurations")
    args = parser.parse_args(argv)
    commit = run.checked_commit(parser, args.out, args.allow_dirty)
    results = args.out / args.data.resolve().name
    auto = auto_point(args.data)
    if not args.only_plot:
        for b in BRANCHING_SWEEP:
            if not result_file(results, b, auto).exists():
                run.main(["--data", str(args.data), "--config", f"hce-j-b{b}", "--out", str(args.out)])
    rows = sweep_rows(results, auto)
    if not rows:
        parser.error(f"no hce-j-b<b>.json results under {results}")
    # each point is its own benchmarks.run row (commit and params); this file gathers them
    params = {str(row["branching"]): row.pop("params") for row in rows}
    write_json(results / "branching.json", {"config": "branching-sweep", "commit": commit, "dirty": commit.endswith("+dirty"),
                                            "params": params, "rows": rows})
    plot(rows, results / "branching.png")
    print(f"{'b':>4} {'nDCG@10':>8} {'R@100':>8}")
    for r in rows:
        print(f"{r['branching']:>4} {r['ndcg@10']:>8.4f} {r['recall@100']:>8.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
