"""Sharded against single-pass corpus encoding on real text (issue 47, item 4; the shards of item 3).

    python -m benchmarks.sharded_encoding [--corpus /work/shared/data/scifact/corpus.jsonl] [--lengths 256 64]

The corpus's documents (title and text joined as ``passage_texts`` joins them) are encoded with
the bundled MiniLM (``Encoder.encode``, ``encoder.batch_size`` texts a batch, on the CPU) at each
``--lengths`` passage length (default: the resolved ``encoder.max_passage_length``, 256, and 64):

* ``single``: one process, torch with ``--threads`` threads (2: every core of this machine);
* ``sharded``: ``--workers`` processes started together, each encoding one contiguous shard
  (``stages.encode_corpus.shard_bounds``, as ``fresh-retriever encode-corpus --shard i/n`` splits
  the corpus) with one torch thread.

Each process loads the model, then waits at a barrier, so the clock starts when every process
is ready (model loading, about 1 s a process, is reported apart). Throughput is documents over
the wall time from the first start to the last finish; beside it, documents per CPU second of the
encoding processes (``time.process_time``, every thread, the tokenizer's included) and their CPU
share (CPU seconds over wall seconds times the cores): on a machine others share, wall-clock
throughput moves with their load, documents per CPU second much less. ``Encoder.encode`` is called directly: no
embedding cache is read or written (the stage's cache writes a chunk every 2048 texts; not timed).
The runs alternate, ``--repeats`` times each; the median throughput counts. The issue's target:
sharded on 2 workers at least 90 % of the single process's throughput on the same 2 cores.

Writes ``benchmarks/results/scale/sharded_encoding.{json,md,png}``; refused from uncommitted code
unless ``--allow-dirty`` (as ``benchmarks.run``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from benchmarks.run import checked_commit, machine
from benchmarks.scale import OUT
from model_code.config import EncoderParams
from model_code.data.ingested import passage_texts
from model_code.io import write_json
from model_code.stages.encode_corpus import shard_bounds

CORPUS = Path("/work/shared/data/scifact/corpus.jsonl")
TARGET = 0.9


def encode_part(texts: list[str], max_length: int, batch_size: int, threads: int, barrier, results) -> None:
    """One process's part: load the encoder, wait for the others, encode, report the times."""
    import torch

    from model_code.models.encoder import Encoder

    torch.set_num_threads(threads)
    began = time.time()
    encoder = Encoder(device=torch.device("cpu"))
    loaded = time.time()
    barrier.wait()
    start, cpu = time.time(), time.process_time()  # wall clock: comparable across the processes
    encoder.encode(texts, max_length, batch_size)
    results.put({"documents": len(texts), "threads": torch.get_num_threads(), "load_seconds": loaded - began,
                 "start": start, "end": time.time(), "cpu_seconds": time.process_time() - cpu})


def encode_in_processes(parts: list[list[str]], max_length: int, batch_size: int, threads: int) -> dict:
    """Encode each part in its own process (spawned, all started together); documents a second
    over the wall time from the first start to the last end."""
    context = mp.get_context("spawn")
    barrier, results = context.Barrier(len(parts)), context.Queue()
    processes = [context.Process(target=encode_part, args=(part, max_length, batch_size, threads, barrier, results))
                 for part in parts]
    for process in processes:
        process.start()
    done = []
    while len(done) < len(processes):
        try:
            done.append(results.get(timeout=5))
        except queue.Empty:
            if any(process.exitcode for process in processes):  # the others would wait at the barrier for ever
                for process in processes:
                    process.terminate()
                raise RuntimeError("an encoding process failed") from None
    for process in processes:
        process.join()
    seconds = max(r["end"] for r in done) - min(r["start"] for r in done)
    documents, cpu = sum(r["documents"] for r in done), sum(r["cpu_seconds"] for r in done)
    return {"processes": len(parts), "threads": threads, "documents": documents, "seconds": seconds,
            "documents_per_second": documents / seconds, "cpu_seconds": cpu, "documents_per_cpu_second": documents / cpu,
            "cpu_share": cpu / (seconds * os.cpu_count()),
            "process_seconds": sorted(r["end"] - r["start"] for r in done),
            "load_seconds": max(r["load_seconds"] for r in done), "load_average": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    encoder = EncoderParams()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharded_encoding", description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="a BEIR corpus.jsonl")
    parser.add_argument("--lengths", type=int, nargs="+", default=[encoder.max_passage_length, 64])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the single process")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="the first N documents only (a smoke test)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args(argv)
    if not args.corpus.is_file():
        print(f"{args.corpus}: no such corpus; skipped", file=sys.stderr)
        return
    commit = checked_commit(parser, args.out, args.allow_dirty)
    corpus = pd.read_json(args.corpus, lines=True, dtype={"_id": str}).fillna({"title": ""})
    texts = passage_texts(corpus.iloc[: args.limit])
    shards = [texts[start:end] for start, end in shard_bounds(len(texts), args.workers)]
    runs = []
    for max_length in args.lengths:
        for repeat in range(args.repeats):
            order = [("single", [texts], args.threads), ("sharded", shards, 1)]
            for mode, parts, threads in order if repeat % 2 == 0 else order[::-1]:
                run = {"mode": mode, "max_length": max_length, "repeat": repeat,
                       **encode_in_processes(parts, max_length, encoder.batch_size, threads)}
                runs.append(run)
                print(f"{max_length:>4} {mode:<8} {run['documents_per_second']:7.1f} documents/s "
                      f"({run['seconds']:.1f} s; load average {run['load_average']:.1f})", flush=True)
                write(args, commit, encoder, len(texts), runs)


def write(args: argparse.Namespace, commit: str, encoder: EncoderParams, documents: int, runs: list[dict]) -> None:
    summary = {}
    for max_length in dict.fromkeys(r["max_length"] for r in runs):
        median = {(mode, key): statistics.median(r[key] for r in runs if r["max_length"] == max_length and r["mode"] == mode)
                  for mode in ("single", "sharded") for key in ("documents_per_second", "documents_per_cpu_second")
                  if any(r["max_length"] == max_length and r["mode"] == mode for r in runs)}
        if len(median) == 4:
            ratio = median["sharded", "documents_per_second"] / median["single", "documents_per_second"]
            summary[str(max_length)] = {
                **{f"{mode}_{key}": value for (mode, key), value in median.items()}, "ratio": ratio,
                "cpu_ratio": median["sharded", "documents_per_cpu_second"] / median["single", "documents_per_cpu_second"],
                "target_met": ratio >= TARGET}
    report = {
        "benchmark": "sharded_encoding", "commit": commit, "machine": machine(), "date": dt.date.today().isoformat(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "allow_dirty"},
        "params": {"encoder": encoder.model_dump(), "data": {"shards": args.workers}},
        "data": f"{args.corpus} ({documents} documents)", "target": {"ratio": TARGET}, "runs": runs, "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "sharded_encoding.json", report)
    (args.out / "sharded_encoding.md").write_text(table(report))
    plot(report, args.out / "sharded_encoding.png")


def table(report: dict) -> str:
    lines = [(f"# Sharded against single-pass encoding ({report['date']}, commit {report['commit']}, "
             f"{report['machine']})"), "", f"Data: {report['data']}; settings: `{report['settings']}`.", "",
             ("| max length | mode | processes x threads | documents/s | seconds | per process s | documents/CPU s | "
              "CPU share | load s | load avg |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['max_length']} | {r['mode']} | {r['processes']} x {r['threads']} | "
                     f"{r['documents_per_second']:.1f} | {r['seconds']:.1f} | "
                     f"{', '.join(f'{s:.1f}' for s in r['process_seconds'])} | {r['documents_per_cpu_second']:.2f} | "
                     f"{r['cpu_share']:.0%} | {r['load_seconds']:.1f} | "
                     f"{r['load_average']:.1f} |")
    lines += ["", (f"| max length | single documents/s | sharded documents/s | sharded / single | "
              f">= {report['target']['ratio']:.0%} | single documents/CPU s | sharded documents/CPU s | sharded / single |"),
              "|---|---|---|---|---|---|---|---|"]
    for length, s in report["summary"].items():
        lines.append(f"| {length} | {s['single_documents_per_second']:.1f} | {s['sharded_documents_per_second']:.1f} | "
                     f"{s['ratio']:.2f} | {'yes' if s['target_met'] else 'no'} | "
                     f"{s['single_documents_per_cpu_second']:.2f} | {s['sharded_documents_per_cpu_second']:.2f} | "
                     f"{s['cpu_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    lengths = list(report["summary"])
    for offset, mode in ((-0.2, "single"), (0.2, "sharded")):
        axis.bar([i + offset for i in range(len(lengths))],
                 [report["summary"][n][f"{mode}_documents_per_second"] for n in lengths], width=0.4, label=mode)
    axis.set_xticks(range(len(lengths)), [f"max length {n}" for n in lengths])
    axis.set(ylabel="documents / second", title=f"{report['data']}")
    axis.legend()
    figure.suptitle(f"{report['machine']}, commit {report['commit']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    main()
