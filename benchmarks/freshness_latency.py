"""Seconds from the inbox sensor's tick to searchable, per retriever kind, through the production path.

    python -m benchmarks.freshness_latency --data ../shared/data/scifact --kinds dense svdr [--batches 10]

For each kind in turn, on the same machine in one run: a champion over the *old* documents (the
shipped ``params.yaml`` with ``retriever.kind`` set, no training: what a batch costs depends on the
model's shape and the index, not on its weights), registered; then the first ``--batches`` batches
of *new* documents (``--batch-size`` each, the pipeline's hash split, in corpus order; the test qrels
are never on disk) streamed through ``benchmarks.freshness_stream``: inbox sensor tick -> ingest,
queries, drift report -> drift sensor tick -> incremental update -> registered champion, with
thresholds that never ask for a retrain. Per batch: ``searchable_s`` (tick to a new index version
holding the batch: the drift report's seconds plus the update's own), ``update_s`` (the update's
own: its manifest's ``total_ms``, from reading the batch to the new version's rows, its save to disk
not counted) and ``registered_s`` (tick to the registered champion, the save included); the first
batch of each kind (``batches[0]``) loads the encoder and opens the stores and is left out of the
medians.

Writes ``benchmarks/results/<dataset>/freshness-latency.json`` (with the commit, the resolved
params per kind, the machine; refused from uncommitted code unless ``--allow-dirty``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

import dagster as dg
import numpy as np
import yaml

from benchmarks import freshness_stream as stream
from benchmarks.configs import PARAMS_FILE
from benchmarks.harness import beir_directory, results_arguments
from benchmarks.run import checked_commit, machine, run_params
from model_code.config import Params, deep_merge, load_params
from model_code.io import tree_sha256, write_json
from model_code.layout import Layout
from model_code.retrievers.registry import kind_names
from tracking.registry import register


def kind_overrides(kind: str) -> dict:
    """What the harness sets on the params file for a kind's champion (its data path aside)."""
    return {"data": {"source": "parquet", "include_incoming": False},
            "eval": {"split": "dev"},  # the test qrels are withheld
            "train": {"enabled": False},
            "retriever": {"kind": kind},
            "freshness": {"thresholds": stream.NEVER_RETRAIN.model_dump()}}


def measure_kind(kind: str, base: dict, source: Path, new_docs, batches: int, batch_size: int,
                 root: Path) -> tuple[dict, Params]:
    """One kind's champion over the old documents at ``source`` and ``batches`` batches of
    ``new_docs`` applied to it: the per-batch timings and their medians, and the champion's params."""
    workspace = root / kind
    workspace.mkdir()
    params_file = workspace / "params.yaml"
    params_file.write_text(yaml.safe_dump(deep_merge(deep_merge(base, kind_overrides(kind)), {"data": {"path": str(source)}})))
    params = load_params(params_file)
    uri = f"sqlite:///{root / f'mlflow-{kind}.db'}"
    start = time.perf_counter()
    run_params(params, workspace)
    layout = Layout(workspace)
    register(params, layout, tracking_uri=uri)
    setup_s = time.perf_counter() - start
    rows = []
    with dg.instance_for_test() as instance:
        batch_stream = stream.BatchStream(params, params_file, layout, uri, instance)
        for number in range(batches):
            documents = new_docs.iloc[number * batch_size:(number + 1) * batch_size]
            applied = batch_stream.apply(stream.write_jsonl(root / f"{kind}-batch-{number + 1:03d}.jsonl", documents))
            rows.append({"batch": number + 1, "documents": applied.report["documents"],
                         "searchable_s": applied.searchable_s, "update_s": applied.update_s,
                         "drift_report_s": applied.drift_report_s, "registered_s": applied.registered_s})
            print(f"{kind:<8} batch {number + 1:>3}: {rows[-1]['documents']} docs, searchable {applied.searchable_s:.2f} s "
                  f"(update {rows[-1]['update_s']:.3f} s), registered {applied.registered_s:.2f} s", flush=True)
    steady = rows[1:]
    medians = {f"{key}_median": float(np.median([r[key] for r in steady]))
               for key in ("searchable_s", "update_s", "drift_report_s", "registered_s")}
    return {"champion_setup_s": setup_s, **medians,
            "searchable_s_max": max(r["searchable_s"] for r in steady), "batches": rows}, params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.freshness_latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="BEIR directory")
    parser.add_argument("--params", type=Path, default=PARAMS_FILE,
                        help="the settings each kind's champion starts from (default: the shipped params.yaml)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="an empty or new directory for the workspaces (default: a new temporary one)")
    parser.add_argument("--kinds", nargs="+", default=["dense", "svdr"], choices=kind_names())
    parser.add_argument("--batches", type=int, default=10, help="batches per kind (the first is reported apart)")
    parser.add_argument("--batch-size", type=int, default=20)
    results_arguments(parser)
    args = parser.parse_args(argv)
    if args.batches < 2 or args.batch_size < 1:
        parser.error("--batches must be at least 2 (the first is reported apart) and --batch-size at least 1")
    data = beir_directory(parser, args.data)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    base = yaml.safe_load(args.params.read_text())
    root = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="freshness-latency-"))
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        parser.error(f"--workdir {root} is not empty")
    test_split = Params.model_validate(base).eval.split
    probe = stream.ingest(base, stream.beir_without(data, test_split, root / "without-test"), root / "probe")
    new_docs, _, _ = stream.old_only_source(probe, root / "old_source")
    if len(new_docs) < args.batches * args.batch_size:
        parser.error(f"{args.data} has {len(new_docs)} new documents: fewer than --batches x --batch-size")
    kinds, params = {}, {}
    for kind in args.kinds:
        kinds[kind], resolved = measure_kind(kind, base, root / "old_source", new_docs, args.batches, args.batch_size, root)
        params[kind] = resolved.model_dump(mode="json")
    result = {"dataset": data.name, "config": "freshness-latency", "batch_size": args.batch_size,
              "batches": args.batches, "kinds": kinds, "params": params,
              "overrides": {k: kind_overrides(k) for k in args.kinds},
              "params_file": str(args.params),
              "machine": machine(), "date": dt.date.today().isoformat(), "commit": commit,
              "dirty": commit.endswith("+dirty"), "dataset_sha256": tree_sha256(data)}
    write_json(args.out / data.name / "freshness-latency.json", result)
    for kind, measured in kinds.items():
        print(f"{kind:<8} searchable {measured['searchable_s_median']:.2f} s median (max {measured['searchable_s_max']:.2f}), "
              f"the update itself {measured['update_s_median']:.3f} s, registered {measured['registered_s_median']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
