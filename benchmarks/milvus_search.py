"""Search through the ``milvus`` store at growing corpus sizes (issue 46's target: "search at 100k
documents: p99 <= 50 ms per query with recall@10 >= 0.95 of Flat", on this machine's 2 cores).

    python -m benchmarks.milvus_search [--sizes 10000 100000] [--modes lite server]
                                       [--index-types HNSW FLAT] [--write-sets 100] [--budget-s 45]

The data are ``benchmarks.scale``'s (same seed, same order of generation: the same documents and
queries as its FAISS rows at the same sizes): synthetic 384-dimensional unit vectors around random
directions. Everything goes through the store a retriever serves with: ``MilvusStore.build`` (a new
collection, its rows inserted, the index declared) and ``MilvusStore.search(q, 10)`` one query at a
time, so each search carries the visibility filter ``born in [..] and removes == -1``. Three places
the collection lives (``--modes``): ``lite``, a Milvus Lite ``.db`` file in a temporary folder
(pymilvus serves it from a thread of this process),
``server``, the loopback ``milvus-lite server``, and ``standalone``, a Milvus 2.3.5 standalone server
(the Milvus engine: ``milvus-server`` of the PyPI package ``milvus``), each started by
``orchestration.milvus_lite.up`` on a free port in a temporary folder and stopped by ``down``. For each size, mode and index type (``HNSW`` with M
``--hnsw-m``, efConstruction ``--ef-construction`` and ``index.ef_search`` ``--ef-search``; ``FLAT``):

* ``build_s``: ``MilvusStore.build`` of the whole corpus; ``first_search_ms``: the first search after it;
* then ``--updates`` tiny updates (one random row each, ``add`` then ``save_delta_files``: ``add_ms``,
  each update's add and save), and a view listing ``--write-sets`` write-sets: the updated view's own
  and never-written write-set ids up to that number (the filter a version after ``--write-sets`` - 1
  updates searches with; writing them all would take 99 updates, each of which reads the collection
  through the filter: minutes at 100k);
* then, query by query and interleaved (so that the load of whatever else runs on the machine falls on
  all alike): the view as built (one write-set: the search a freshly trained version makes; its
  p50/p99 ms and recall@10 against exact inner-product search in NumPy are the row's headline), the
  updated view (``--write-sets`` write-sets: the filter's cost as a lineage grows), and the same
  search with no filter at all through the pymilvus client (``unfiltered``: what the engine costs
  without the views). The extra rows are random directions, far from every query: recall of both
  views is over the built corpus.

Then ``commit_log_read_ms``: what a server following the champion pays each ``serve.refresh_seconds``,
one read of the lineage's commit log (``milvus_commits``) holding ``COMMITS`` commits, with nothing new
in it (median of ``COMMITS`` reads by a reader that has read it once, as a follower's are).

Then ``batched``: the first ``--batch`` queries in one ``search`` call, three times (median call
and its share per query). Milvus Lite 3.2.2 does work in Python for every row of the collection on
each call (``milvus_lite/search/executor_indexed.py`` maps every row's primary key to its latest
write before it merges the segments' hits), whatever the index: that cost is per call, not per
query, so a batch shows what a query costs once it is shared.

A measurement stops after ``--queries`` queries or once it has run ``--budget-s`` seconds with at
least ``--min-queries`` done (the number measured is recorded: a p99 of few queries is close to their
maximum). Writes ``benchmarks/results/scale/<--name>.{json,md,png}`` (``milvus``) with the commit and the machine;
refused from uncommitted code unless ``--allow-dirty`` (as ``benchmarks.run``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import shutil
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from benchmarks.harness import RESULTS
from benchmarks.run import checked_commit, machine
from benchmarks.scale import K, exact_top_k, exponent, synthetic
from model_code.config import IndexParams
from model_code.io import write_json
from model_code.stores.milvus_commits import Commit, CommitLog
from model_code.stores.milvus_store import Connection, MilvusStore, new_write_set
from orchestration import milvus_lite

OUT = Path(__file__).parent / "results" / "scale"
TARGET_P99_MS, TARGET_RECALL = 50.0, 0.95  # issue 46, at 100k documents
COMMITS = 20  # commits in the log whose read is timed


@contextmanager
def milvus_at(mode: str, folder: Path):
    """The URI of a fresh Milvus Lite ``.db`` file (``lite``), loopback Milvus Lite server (``server``)
    or Milvus standalone server (``standalone``) in ``folder``."""
    if mode == "lite":
        yield str(folder / "milvus.db")
        return
    data_dir = folder / "server"
    try:
        yield milvus_lite.up(data_dir, milvus_lite.free_port(), engine="standalone" if mode == "standalone" else "lite")
    finally:
        milvus_lite.down(data_dir)


def settings(uri: str, index_type: str, args: argparse.Namespace) -> IndexParams:
    return IndexParams(backend="milvus", ef_search=args.ef_search,
                       milvus={"uri": uri, "index_type": index_type, "hnsw_m": args.hnsw_m,
                               "ef_construction": args.ef_construction, "timeout_s": args.timeout_s})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def summary(latencies: list[float], found: list[float] | None = None) -> dict:
    row = {"p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 0.99),
           "mean_ms": statistics.fmean(latencies)}
    if found is not None:
        row["recall_at_10"] = float(np.mean(found))
    return row


def recall_at_k(ids: list[str], truth: np.ndarray) -> float:
    """The share of the exact top ``K`` (row numbers) among the ids a search returned."""
    return len(set(ids) & {str(i) for i in truth.tolist()}) / K


def measure(index_type: str, uri: str, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray,
            args: argparse.Namespace, scratch: Path) -> dict:
    ids = [str(i) for i in range(len(vectors))]
    start = time.perf_counter()
    store = MilvusStore.build(vectors, ids, settings(uri, index_type, args))
    built = time.perf_counter() - start
    start = time.perf_counter()
    store.search(queries[:1], K)
    first = time.perf_counter() - start
    as_built = MilvusStore(store.connection, base=list(store.base))  # the view of one write-set
    rng = np.random.default_rng(args.seed + 1)
    extra = rng.standard_normal((min(args.updates, args.write_sets - 1), vectors.shape[1]))
    extra = (extra / np.linalg.norm(extra, axis=1, keepdims=True)).astype(np.float32)
    adds = []
    for i, vector in enumerate(extra):
        start = time.perf_counter()
        store.add(vector[None], [f"extra-{i}"])
        store.save_delta_files(scratch / f"delta-{i}")
        adds.append((time.perf_counter() - start) * 1000)
    many = MilvusStore(store.connection, base=list(store.visible))
    while len(many.visible) < args.write_sets:
        many.base.append(new_write_set())  # ids no row carries: the same filter as a longer lineage's
    connection = store.connection
    client, params = connection.client, connection.search_params(K)

    def unfiltered(query: np.ndarray) -> list[str]:
        hits = client.search(connection.collection, data=[query], limit=K, output_fields=["doc_id"],
                             search_params=params, timeout=connection.timeout_s)
        return [hit["entity"]["doc_id"] for hit in hits[0]]

    searches = {"one_write_set": lambda q: as_built.search(q[None], K)[1][0],
                "many_write_sets": lambda q: many.search(q[None], K)[1][0],
                "unfiltered": unfiltered}
    latencies: dict[str, list[float]] = {name: [] for name in searches}
    found: dict[str, list[float]] = {name: [] for name in searches}
    began = time.perf_counter()
    for done, (query, expected) in enumerate(zip(queries, truth)):
        if done >= args.min_queries and time.perf_counter() - began > args.budget_s:
            break
        for name, search in searches.items():
            start = time.perf_counter()
            hits = search(query)
            latencies[name].append((time.perf_counter() - start) * 1000)
            found[name].append(recall_at_k(hits, expected))
    batched = None
    if args.batch:
        batch, calls = queries[:args.batch], []
        for _ in range(3):
            start = time.perf_counter()
            _, hits = as_built.search(batch, K)
            calls.append((time.perf_counter() - start) * 1000)
        call = statistics.median(calls)
        batched = {"queries": len(batch), "call_ms_p50": call, "ms_per_query": call / len(batch),
                   "recall_at_10": float(np.mean([recall_at_k(h, t) for h, t in zip(hits, truth)]))}
    log_read = commit_log_read_ms(connection)
    index = client.describe_index(connection.collection, "vector", timeout=connection.timeout_s)
    client.drop_collection(connection.collection, timeout=connection.timeout_s)
    return {"index_type": index_type, "build_s": built, "first_search_ms": first * 1000,
            "queries": len(latencies["one_write_set"]), "write_sets": len(many.visible), "updates": len(adds),
            "add_ms_p50": statistics.median(adds) if adds else None,
            **summary(latencies["one_write_set"], found["one_write_set"]),
            "many_write_sets": summary(latencies["many_write_sets"], found["many_write_sets"]),
            "unfiltered": summary(latencies["unfiltered"], found["unfiltered"]), "batched": batched,
            "commit_log_read_ms": log_read,
            "index": {k: index.get(k) for k in ("index_type", "indexed_rows", "pending_index_rows", "state")}}


def commit_log_read_ms(lineage: Connection) -> float:
    """The median time of a follower's poll of ``lineage``'s commit log holding ``COMMITS`` commits;
    the log is dropped afterwards."""
    writer = CommitLog(lineage, lambda commit: True)
    for i in range(COMMITS):
        writer.commit(Commit(version=f"v{i + 1:04d}", delta_of=f"v{i:04d}" if i else "base", delta_uri="runs:/-/delta",
                             run_id=f"run-{i}", alias="champion"))
    reader, reads = CommitLog(lineage, lambda commit: True).read(), []
    for _ in range(COMMITS):
        start = time.perf_counter()
        reader.read()
        reads.append((time.perf_counter() - start) * 1000)
    assert len(reader.commits) == COMMITS
    lineage.client.drop_collection(reader.connection.collection, timeout=lineage.timeout_s)
    return statistics.median(reads)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.milvus_search", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--modes", nargs="+", choices=["lite", "server", "standalone"], default=["lite", "server"])
    parser.add_argument("--index-types", nargs="+", choices=["HNSW", "FLAT"], default=["HNSW", "FLAT"])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200, help="scale.py's query set; the first ones are measured")
    parser.add_argument("--min-queries", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=45, help="seconds of queries after which a measurement "
                        "stops (once --min-queries were measured)")
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--noise", type=float, default=0.6)
    parser.add_argument("--write-sets", type=int, default=100, help="write-sets the second view lists")
    parser.add_argument("--updates", type=int, default=3, help="tiny updates written (add + save_delta_files)")
    parser.add_argument("--batch", type=int, default=64, help="queries in one call for the batched measure (0: skip)")
    parser.add_argument("--hnsw-m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument("--ef-search", type=int, default=128)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="index.milvus.timeout_s (a search at 100k "
                        "may take seconds)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--name", default="milvus", help="the results files' name")
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args(argv)
    under_results = args.out.resolve().is_relative_to(RESULTS.resolve())
    commit = checked_commit(parser, RESULTS if under_results else args.out, args.allow_dirty)
    rng = np.random.default_rng(args.seed)  # as benchmarks.scale draws them: the same documents and queries
    centers = rng.standard_normal((args.clusters, args.dim))
    queries = synthetic(args.queries, centers, args.noise, rng)
    measures: dict[str, list[dict]] = {}
    for n in sorted(args.sizes):
        vectors = synthetic(n, centers, args.noise, rng)
        truth = exact_top_k(vectors, queries, K)
        for mode in args.modes:
            folder = Path(tempfile.mkdtemp(prefix=f"milvus-search-{mode}-"))
            try:
                with milvus_at(mode, folder) as uri:
                    for index_type in args.index_types:
                        load = os.getloadavg()[0]
                        row = {"documents": n, "mode": mode, "load_average": load,
                               **measure(index_type, uri, vectors, queries, truth, args, folder)}
                        row["load_average_after"] = os.getloadavg()[0]
                        measures.setdefault(f"milvus-{mode}-{index_type.lower()}", []).append(row)
                        print(f"{n:>8} {mode:<6} {index_type:<5} build {row['build_s']:7.1f} s  p50 "
                              f"{row['p50_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms  recall {row['recall_at_10']:.3f}"
                              f"  ({row['queries']} queries; {args.write_sets} write-sets: p50 "
                              f"{row['many_write_sets']['p50_ms']:.1f} ms; unfiltered p50 "
                              f"{row['unfiltered']['p50_ms']:.1f} ms)", flush=True)
                        write(args, commit, measures)  # after every measure: a killed run keeps what it measured
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    print(f"written to {args.out}")


def write(args: argparse.Namespace, commit: str, measures: dict) -> None:
    report = {
        "benchmark": "milvus_search", "commit": commit, "machine": machine(), "date": dt.date.today().isoformat(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "allow_dirty"},
        # the store's settings as a results file names them (index_type and uri per row: FLAT / HNSW, lite / server)
        "params": {"index": settings("<per mode>", "HNSW", args).model_dump()},
        "versions": {name: _version(name) for name in ("pymilvus", "milvus-lite", "milvus")},
        "data": "benchmarks.scale's synthetic unit vectors around random directions, queries from the same mixture "
                "(same seed: the same documents and queries as its FAISS rows)",
        "target": {"documents": 100_000, "p99_ms": TARGET_P99_MS, "recall_at_10": TARGET_RECALL},
        "measures": measures,
        "growth_exponents": {name: exponent([(m["documents"], m["build_s"]) for m in rows])
                             for name, rows in measures.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{args.name}.json", report)
    (args.out / f"{args.name}.md").write_text(table(report))
    plot(report, args.out / f"{args.name}.png")


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # milvus: x86-64 Linux only
        return "not installed"


def table(report: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines = [f"# Milvus store search ({report['date']}, commit {report['commit']}, {report['machine']}; {versions})",
             "", f"Data: {report['data']}; settings: `{report['settings']}`.", "",
             "Target (issue 46): at 100k documents, p99 <= 50 ms per query with recall@10 >= 0.95.", "",
             (f"Each row: the view as built (1 write-set); beside it the same queries through a view listing "
             f"{report['settings']['write_sets']} write-sets, and with no filter (pymilvus directly); an update "
             f"is one row's `add` + `save_delta_files` (median of {report['settings']['updates']})."), "",
             ("| measure | documents | build s | first search ms | queries | p50 ms | p99 ms | recall@10 | target met | "
              f"p50 / p99 ms, {report['settings']['write_sets']} write-sets | p50 / p99 ms, no filter | "
              "batched: ms per query (ms per call) | update ms | commit-log read ms | load avg |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in report["measures"].items():
        for m in rows:
            met = ("yes" if m["p99_ms"] <= TARGET_P99_MS and m["recall_at_10"] >= TARGET_RECALL else "no") \
                if m["documents"] == report["target"]["documents"] else "—"
            many, add, batched = m["many_write_sets"], m["add_ms_p50"], m.get("batched")
            shared = ("—" if not batched else f"{batched['ms_per_query']:.1f} ({batched['call_ms_p50']:.0f} for "
                      f"{batched['queries']}, recall {batched['recall_at_10']:.3f})")
            lines.append(f"| {name} | {m['documents']} | {m['build_s']:.1f} | {m['first_search_ms']:.0f} | "
                         f"{m['queries']} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['recall_at_10']:.3f} | {met} | "
                         f"{many['p50_ms']:.1f} / {many['p99_ms']:.1f} (recall {many['recall_at_10']:.3f}) | "
                         f"{m['unfiltered']['p50_ms']:.1f} / {m['unfiltered']['p99_ms']:.1f} | {shared} | "
                         f"{'—' if add is None else f'{add:.0f}'} | "
                         f"{m['commit_log_read_ms']:.1f} | "
                         f"{m['load_average']:.1f}–{m['load_average_after']:.1f} |")
    lines += ["", "| measure | growth exponent (build seconds) |", "|---|---|"]
    for name, value in report["growth_exponents"].items():
        lines.append(f"| {name} | {'—' if value is None else f'{value:.2f}'} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in report["measures"].items():
        sizes = [m["documents"] for m in rows]
        axes[0].loglog(sizes, [m["build_s"] for m in rows], marker="o", label=name)
        line, = axes[1].loglog(sizes, [m["p99_ms"] for m in rows], marker="o", label=f"{name} (1 write-set)")
        axes[1].loglog(sizes, [m["many_write_sets"]["p99_ms"] for m in rows], marker="x", linestyle="--",
                       color=line.get_color(), label=f"{name} ({rows[0]['write_sets']} write-sets)")
    axes[1].axhline(TARGET_P99_MS, color="grey", linestyle=":", label="target p99 (issue 46)")
    axes[0].set(xlabel="documents", ylabel="build seconds", title="MilvusStore.build")
    axes[1].set(xlabel="documents", ylabel="query p99 ms (top 10, one query)", title="MilvusStore.search")
    for axis in axes:
        axis.legend(fontsize=7)
    figure.suptitle(f"{report['machine']}, commit {report['commit']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    main()
