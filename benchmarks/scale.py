"""Growth curves: how the index stores and the corpus tree grow with the corpus (issue 47, item 4).

    python -m benchmarks.scale [--sizes 10000 100000] [--dim 384] [--queries 200] [--cap 300]

The vectors are synthetic, not encoded text (encoding a million documents takes hours on 2 cores):
unit vectors drawn around ``--clusters`` random directions (noise ``--noise``), queries drawn from
the same mixture. The times grow as they would with real embeddings; the recall is this data's
and says little about a real corpus's (measure that on it). For each size, each FAISS index of the
``faiss`` store (``Flat``, ``IVF<4 sqrt N>,Flat`` probing ``--nprobe`` lists, ``HNSW32``) is
built through ``FaissStore.build`` and searched one query at a time for the top 10 after one
warm-up search: build seconds, query p50/p99 ms, recall@10 against exact inner-product search
(NumPy). The corpus tree (``hierarchy.tree.build_tree`` with the default branching) is built with
each builder. Sizes run in increasing order; a measurement that took longer than ``--cap`` seconds
is not repeated at larger sizes (recorded as where the machine stopped). Each measure's growth
exponent is the least-squares slope of log(seconds) on log(documents) over the sizes measured.
Writes ``benchmarks/results/scale/scale.{json,md,png}`` with the commit and the machine;
refused from uncommitted code unless ``--allow-dirty`` (as ``benchmarks.run``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.run import checked_commit, machine
from model_code.config import HierarchyParams, IndexParams
from model_code.hierarchy.tree import build_tree
from model_code.io import write_json
from model_code.stores import store_class

OUT = Path(__file__).parent / "results" / "scale"
K = 10


def synthetic(n: int, centers: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` unit vectors, each a random center plus Gaussian noise, normalised."""
    vectors = centers[rng.integers(0, len(centers), n)] + noise * rng.standard_normal((n, centers.shape[1]))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def exact_top_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Row numbers of each query's k best inner products, in chunks (independent of FAISS)."""
    best = []
    for start in range(0, len(queries), 64):
        scores = queries[start:start + 64] @ vectors.T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        best.append(np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1), axis=1))
    return np.concatenate(best)


def measure_index(factory: str, nprobe: int, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray) -> dict:
    ids = [str(i) for i in range(len(vectors))]
    start = time.perf_counter()
    store = store_class("faiss", "dense").build(vectors, ids, IndexParams(factory=factory, nprobe=nprobe,
                                                                         use_gpu="never"))
    built = time.perf_counter() - start
    store.search(queries[:1], K)  # warm-up
    latencies, found = [], []
    for query, expected in zip(queries, truth):
        start = time.perf_counter()
        _, [hit_ids] = store.search(query[None], K)
        latencies.append((time.perf_counter() - start) * 1000)
        found.append(len({int(h) for h in hit_ids} & set(expected.tolist())) / K)
    ordered = sorted(latencies)
    return {"factory": factory, "seconds": built, "query_p50_ms": statistics.median(latencies),
            "query_p99_ms": ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)],
            "recall_at_10": float(np.mean(found))}


def measure_tree(builder: str, vectors: np.ndarray) -> dict:
    params = HierarchyParams(builder=builder)
    start = time.perf_counter()
    tree = build_tree([str(i) for i in range(len(vectors))], vectors, params.branching_for(len(vectors)), params.niter,
                      params.seed, builder)
    return {"builder": builder, "seconds": time.perf_counter() - start, "depth": tree.stats()["depth"]}


def exponent(points: list[tuple[int, float]]) -> float | None:
    """Slope of log(seconds) on log(documents): 1 = linear growth."""
    if len(points) < 2:
        return None
    x, y = np.log([n for n, _ in points]), np.log([max(s, 1e-9) for _, s in points])
    return float(np.polyfit(x, y, 1)[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    add_growth_arguments(parser, OUT)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--clusters", type=int, default=1000, help="directions the vectors gather around")
    parser.add_argument("--noise", type=float, default=0.6, help="per-coordinate noise around a cluster's direction")
    parser.add_argument("--nprobe", type=int, default=16)
    args = parser.parse_args(argv)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    rng = np.random.default_rng(args.seed)
    centers = rng.standard_normal((args.clusters, args.dim))  # documents and queries: one mixture
    queries = synthetic(args.queries, centers, args.noise, rng)
    largest = largest_sizes(args.max_size)

    def runs_for(n: int) -> dict:
        vectors = synthetic(n, centers, args.noise, rng)
        truth = exact_top_k(vectors, queries, K)
        return {"flat": functools.partial(measure_index, "Flat", args.nprobe, vectors, queries, truth),
                "ivf": functools.partial(measure_index, f"IVF{int(4 * math.sqrt(n))},Flat", args.nprobe, vectors,
                                         queries, truth),
                "hnsw": functools.partial(measure_index, "HNSW32", args.nprobe, vectors, queries, truth),
                "tree-agglomerative": functools.partial(measure_tree, "agglomerative", vectors),
                "tree-divisive": functools.partial(measure_tree, "divisive", vectors)}

    params = {"index": IndexParams(nprobe=args.nprobe, use_gpu="never").model_dump(),
              "hierarchy": HierarchyParams().model_dump()}
    grow(args.sizes, runs_for, args.cap, largest, lambda measures, stopped: write_report(args.out, growth_report(
        "scale", commit, args, params, DATA, measures, stopped, largest)))
    print(f"written to {args.out}")


def add_growth_arguments(parser: argparse.ArgumentParser, out: Path) -> None:
    """The options every growth curve takes: sizes, when a measure stops growing, seed, output."""
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--cap", type=float, default=300, help="seconds after which a measure stops growing")
    parser.add_argument("--max-size", nargs="*", default=[], metavar="MEASURE=N",
                        help="the largest size a measure runs at (e.g. tree-agglomerative=100000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--allow-dirty", action="store_true")


def largest_sizes(max_size: list[str]) -> dict[str, int]:
    """``--max-size MEASURE=N ...`` as {measure: N}."""
    return {name: int(n) for name, n in (item.split("=") for item in max_size)}


def grow(sizes: list[int], runs_for, cap: float, largest: dict[str, int], save) -> None:
    """Run every measure ``runs_for(n)`` names at each size, smallest first; a measure that took
    longer than ``cap`` seconds, or whose ``largest`` size is reached, is not run at larger sizes
    (the first is recorded as where the machine stopped). ``save(measures, stopped)`` after every
    measure: a killed run keeps what it measured. Each row also has the load average beside it."""
    measures: dict[str, list[dict]] = {}
    stopped: dict[str, int] = {}
    for n in sorted(sizes):
        runs = {name: run for name, run in runs_for(n).items() if name not in stopped and n <= largest.get(name, n)}
        for name, run in runs.items():
            result = {"documents": n, "load_average": os.getloadavg()[0], **run()}
            measures.setdefault(name, []).append(result)
            print(f"{n:>9} {name:<24} {result['seconds']:8.2f} s", {k: round(v, 4) for k, v in result.items()
                                                                      if k.startswith(("query", "recall"))})
            if result["seconds"] > cap:
                stopped[name] = n
            save(measures, stopped)


DATA = ("synthetic unit vectors around random directions, queries from the same mixture (not encoded text: times grow "
        "as with real embeddings, recall is this data's)")


def growth_report(benchmark: str, commit: str, args: argparse.Namespace, params: dict, data: str, measures: dict,
                  stopped: dict, largest: dict, exponent_of: tuple[str, ...] = ("seconds",)) -> dict:
    """A growth-curve results file: commit, machine, settings, the params the measured code ran
    with, and per measure its rows and growth exponents (``growth_exponents``: of ``seconds``;
    ``growth_exponents_of``: of each further key of ``exponent_of`` the rows have)."""
    report = {
        "benchmark": benchmark, "commit": commit, "machine": machine(), "date": dt.date.today().isoformat(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "allow_dirty"},
        "params": params,  # the settings the measured code ran with, as a results file names them
        "data": data,
        "measures": measures,
        "growth_exponents": {name: exponent([(m["documents"], m["seconds"]) for m in rows])
                             for name, rows in measures.items()},
        "stopped_after": stopped,
        "largest_size": largest,
    }
    further = {key: {name: exponent([(m["documents"], m[key]) for m in rows]) for name, rows in measures.items()
                     if all(key in m for m in rows)} for key in exponent_of if key != "seconds"}
    if further:
        report["growth_exponents_of"] = further
    return report


COLUMNS = (("seconds", "build s", "{:.2f}"), ("query_p50_ms", "query p50 ms", "{:.3f}"),
           ("query_p99_ms", "query p99 ms", "{:.3f}"), ("recall_at_10", "recall@10", "{:.3f}"))
PANELS = (("seconds", "build seconds", "build"), ("query_p99_ms", "query p99 ms (top 10, one query)", "search"))


def write_report(out: Path, report: dict, columns: tuple = COLUMNS, panels: tuple = PANELS,
                 title: str = "Growth curves") -> None:
    """``<benchmark>.json``, its table (``columns``: key, header, format) and its plot (``panels``:
    key, y label, title; one log-log panel each) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{report['benchmark']}.json", report)
    (out / f"{report['benchmark']}.md").write_text(table(report, columns, title))
    plot(report, out / f"{report['benchmark']}.png", panels)


def table(report: dict, columns: tuple = COLUMNS, title: str = "Growth curves") -> str:
    lines = [f"# {title} ({report['date']}, commit {report['commit']}, {report['machine']})", "",
             f"Data: {report['data']}; settings: `{report['settings']}`.", "",
             f"| measure | documents | {' | '.join(header for _, header, _ in columns)} | load avg |",
             "|---|---|" + "---|" * len(columns) + "---|"]
    for name, rows in report["measures"].items():
        for m in rows:
            cells = [form.format(m[key]) if m.get(key) is not None else "—" for key, _, form in columns]
            lines.append(f"| {name} | {m['documents']} | {' | '.join(cells)} | {m['load_average']:.1f} |")
    further = report.get("growth_exponents_of", {})
    headers = {key: header for key, header, _ in columns}
    lines += ["", f"| measure | growth exponent ({headers.get('seconds', 'seconds').replace(' s', ' seconds')}) | "
              + "".join(f"growth exponent ({headers.get(key, key)}) | " for key in further) + "stopped after |",
              "|---|---|" + "---|" * len(further) + "---|"]
    for name, value in report["growth_exponents"].items():
        stop, limit = report["stopped_after"].get(name), report["largest_size"].get(name)
        why = (f"{stop} documents (over the cap)" if stop else
               f"{limit} documents (--max-size)" if limit else "—")
        values = [value, *(exponents.get(name) for exponents in further.values())]
        lines.append(f"| {name} | {' | '.join('—' if v is None else f'{v:.2f}' for v in values)} | {why} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path, panels: tuple = PANELS) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, (key, label, title) in zip(axes[0], panels):
        for name, rows in report["measures"].items():
            shown = [m for m in rows if m.get(key) is not None]
            if shown:
                axis.loglog([m["documents"] for m in shown], [m[key] for m in shown], marker="o", label=name)
        axis.set(xlabel="documents", ylabel=label, title=title)
        axis.legend(fontsize=8)
    figure.suptitle(f"{report['machine']}, commit {report['commit']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    main()
