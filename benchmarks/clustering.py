"""Corpus-tree build time vs corpus size (HCE target: 100k x 384 in <= 60 s on 2 CPU cores).

    python -m benchmarks.clustering [--sizes 1000 10000 100000] [--builders agglomerative divisive]

Random unit vectors (d = 384) stand in for document embeddings: k-means cost depends on N, d,
k and iterations, not on what the vectors mean. Writes benchmarks/results/clustering/tree_build.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import numpy as np

from benchmarks.harness import results_arguments
from benchmarks.run import checked_commit, machine
from model_code.hierarchy.tree import auto_branching, build_tree
from model_code.io import write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.clustering", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--builders", nargs="+", default=["agglomerative", "divisive"])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--niter", type=int, default=20)
    results_arguments(parser)
    args = parser.parse_args(argv)
    results = args.out
    commit = checked_commit(parser, results, args.allow_dirty)
    rows = []
    for n in args.sizes:
        vectors = np.random.default_rng(0).normal(size=(n, args.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        branching = auto_branching(n)
        for builder in args.builders:
            start = time.perf_counter()
            tree = build_tree([str(i) for i in range(n)], vectors, branching, args.niter, seed=0, builder=builder)
            seconds = time.perf_counter() - start
            stats = tree.stats()
            rows.append({"documents": n, "builder": builder, "branching": branching, "seconds": round(seconds, 2),
                         "depth": stats["depth"], "nodes_per_level": stats["nodes_per_level"]})
            print(f"{n:>8} {builder:<14} b={branching:<4} depth={stats['depth']}  {seconds:8.2f} s", flush=True)
    write_json(results / "clustering" / "tree_build.json",
               {"dim": args.dim, "niter": args.niter, "rows": rows, "machine": machine(), "date": dt.date.today().isoformat(),
                "commit": commit, "dirty": commit.endswith("+dirty"),
                "params": {"sizes": args.sizes, "builders": args.builders, "dim": args.dim, "niter": args.niter}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
