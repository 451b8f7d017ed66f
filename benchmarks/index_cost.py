"""What a configuration's index costs: size on disk, build throughput and query latency (issue #22:
per configuration index MB, encode throughput and ms per query at batch 1 and 64; the multi-vector
index against the single-vector one).

    python -m benchmarks.index_cost --data ../shared/data/scifact \\
        --configs ct-hn mlr-multi-2 mlr-multi-4 mlr-mean mlr-scalar-mix mlr-sc

Every configuration builds its retriever kind through the pipeline's own stages (ingest, train,
index) over one random sample of the corpus (``--sample`` documents, ``--seed``: the same documents
for all) with its *base* encoder (``train.enabled: false``): size, throughput and latency depend on
the shape of the model and the index, not on trained weights, so no training is repeated for
them. Then the dataset's first ``--queries`` queries are searched for the top 10 one at a time (ms per query:
median and mean) and in batches of 64 (ms per query: each batch's time over its queries, median),
after one warm-up search. ``build_docs_per_s`` is the index stage's documents per second
(encoding the documents and building the index); ``index_mb`` the built retriever's files (the
encoder aside); ``latency_ratio`` a configuration's batch-1 median over the first configuration's.
Jobs sharing the machine distort the times: the 1-minute load average before each measurement is
recorded. Writes ``<out>/<dataset>/index-cost.json`` with the commit and each configuration's
resolved params; refused from uncommitted code unless ``--allow-dirty`` (as ``benchmarks.run``).
"""

from __future__ import annotations

import datetime as dt
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.configs import PIPELINE_CONFIGS, resolve_params
from benchmarks.harness import beir_directory, configurations_parser
from benchmarks.report import write_results_table
from benchmarks.run import checked_commit, machine
from benchmarks.svdr_index import directory_mb, load
from model_code.config import Params, deep_merge
from model_code.data.ingested import load_ingested
from model_code.io import tree_sha256, write_json
from model_code.layout import Layout
from model_code.retrievers import load_retriever, read_manifest
from model_code.stages.pipeline import STAGES

BUILT_BY = ("ingest", "train", "index")  # the stages a retriever needs without training
BATCH = 64


def sampled_beir(data_dir: Path, documents: int, seed: int, into: Path) -> Path:
    """``data_dir`` with ``documents`` of its corpus lines drawn at random (all when 0); queries and
    qrels as they are (qrels of documents left out are rejected by ingest, with the reason)."""
    lines = (data_dir / "corpus.jsonl").read_text().splitlines(keepends=True)
    if documents > len(lines):
        raise ValueError(f"--sample {documents}: the corpus has {len(lines)} documents ({data_dir / 'corpus.jsonl'})")
    if documents:
        lines = [lines[i] for i in sorted(np.random.default_rng(seed).choice(len(lines), documents, replace=False))]
    into.mkdir(parents=True)
    (into / "corpus.jsonl").write_text("".join(lines))
    for entry in data_dir.iterdir():
        if entry.name != "corpus.jsonl":
            (into / entry.name).symlink_to(entry.resolve())
    return into


def built(params: Params, workdir: Path) -> tuple[Layout, float]:
    """The configuration's retriever built in ``workdir``: its layout and the index stage's seconds."""
    layout = Layout(workdir)
    for stage in (s for s in STAGES if s.name in BUILT_BY):
        start = time.perf_counter()
        stage.runner()(params, layout)
        seconds = time.perf_counter() - start
    return layout, seconds  # the last stage's: index


def latency(retriever, queries: list[str]) -> dict:
    """ms per query searched one at a time and in batches of ``BATCH`` (top 10)."""
    retriever.search(queries[:1], 10)  # warm-up: lazy loads, first-call allocations
    before, single = load(), []
    for query in queries:
        start = time.perf_counter()
        retriever.search([query], 10)
        single.append(1000 * (time.perf_counter() - start))
    batched = []
    for first in range(0, len(queries), BATCH):
        batch = queries[first : first + BATCH]
        start = time.perf_counter()
        retriever.search(batch, 10)
        batched.append(1000 * (time.perf_counter() - start) / len(batch))
    return {"ms_per_query_batch_1": round(statistics.median(single), 3),
            "ms_per_query_batch_1_mean": round(statistics.fmean(single), 3),
            f"ms_per_query_batch_{BATCH}": round(statistics.median(batched), 3), "load_before": before}


def measure(params: Params, workdir: Path, queries: int) -> dict:
    """The configuration's retriever built in ``workdir``, its size and speeds; searched with the
    dataset's first ``queries`` queries."""
    layout, seconds = built(params, workdir)
    data = load_ingested(layout.ingested)
    manifest = read_manifest(layout.retriever)
    retriever = load_retriever(layout.retriever, layout.encoder)
    documents = len(data.corpus)
    return {"kind": params.retriever.kind, "documents": documents, "rows": manifest.get("rows", documents),
            "build_seconds": round(seconds, 3), "build_docs_per_s": round(documents / seconds, 2),
            "index_mb": round(directory_mb(layout.retriever), 3),
            **latency(retriever, data.queries["text"].tolist()[:queries])}


def main(argv: list[str] | None = None) -> int:
    parser = configurations_parser("benchmarks.index_cost", __doc__,
                                   "configurations to build (the first is the latency ratio's reference)")
    parser.add_argument("--sample", type=int, default=1000, help="corpus documents indexed (0: all)")
    parser.add_argument("--queries", type=int, default=128, help="queries searched (the dataset's first)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data = beir_directory(parser, args.data)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    start_load = load()
    with tempfile.TemporaryDirectory(prefix="bench-index-cost-") as workroot:
        try:
            sample = sampled_beir(data, args.sample, args.seed, Path(workroot) / data.name)
        except ValueError as error:
            parser.error(str(error))
        params = {config: resolve_params(deep_merge(PIPELINE_CONFIGS[config], {"train": {"enabled": False}}), sample)
                  for config in args.configs}
        measured = {}
        for config, settings in params.items():
            measured[config] = row = measure(settings, Path(workroot) / config, args.queries)
            print(f"{config:<18} {row['index_mb']:>8.2f} MB {row['build_docs_per_s']:>8.1f} docs/s "
                  f"{row['ms_per_query_batch_1']:>8.2f} ms/query (1) {row[f'ms_per_query_batch_{BATCH}']:>8.2f} ms/query ({BATCH})")
    reference = measured[args.configs[0]]["ms_per_query_batch_1"]
    for row in measured.values():
        row["latency_ratio"] = round(row["ms_per_query_batch_1"] / reference, 3)
    dataset = data.name
    write_json(args.out / dataset / "index-cost.json", {
        "dataset": dataset, "config": "index-cost", "configs": measured, "sample": args.sample, "seed": args.seed,
        "queries": args.queries, "batch": BATCH, "load_average": {"start": start_load, "end": load()},
        "machine": machine(), "date": dt.date.today().isoformat(), "commit": commit, "dirty": commit.endswith("+dirty"),
        "params": {config: p.model_dump(mode="json") for config, p in params.items()},
        "dataset_sha256": tree_sha256(data),
    })
    write_results_table(args.out, args.out.parent / "RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
