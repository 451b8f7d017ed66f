"""SVDR's binary bag-of-tokens index against the dense FAISS index: build speed, size, additions,
query latency (issue #24).

    python -m benchmarks.svdr_index --data ../shared/data/scifact [--sample 1000] [--lengths 256 64]

In one run, on one fixed random sample of the corpus (``--sample`` documents, ``--seed``; the same
texts for both, as ``passage_texts`` joins title and text everywhere), at each passage length of ``--lengths`` (default:
256 tokens, the reference's length, and the project's ``encoder.max_passage_length``):

* **binary**: ``index.token_bags.bag_of_tokens`` (tokenizer only, no model) into a CSR matrix,
  the median of ``--repeats`` timings, also over the whole corpus;
* **dense**: the dense kind's build, ``Encoder.encode`` of ``encoder.model`` (MiniLM) with
  ``encoder.batch_size`` then ``FaissStore.build`` (``index.factory``), timed once (the model loaded
  before the clock starts, as is the tokenizer for binary);

documents/s and MB (in memory and as saved) of each, and ``metrics.build_speedup_vs_dense``: binary
documents/s over dense documents/s at 256 tokens (``build_speedup_vs_dense_at_<L>`` at the other
lengths). Freshness path: kind ``svdr`` (search ``beta``) over the corpus minus ``--added``
documents, which then arrive through the kind's ``add`` in batches of 20 and of 1 (ms per added
document: median and p95 over the batches). Query latency per search mode (``--queries`` test
queries one at a time, median ms; ``--queries 0`` skips it): ``full``, ``alpha``, ``beta``,
``beta_rerank`` with m = 10 and 100, over the sample indexed at the project's passage length with
the *untrained* sparse encoder (latency does not depend on its weights).

The machine is shared with other jobs: the 1-minute load average before each measurement and at
the start and end is recorded. Writes ``<out>/<dataset>/svdr-index.json`` with the commit and the
resolved params; refused from uncommitted code unless ``--allow-dirty`` (as ``benchmarks.run``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from benchmarks.configs import resolve_params
from benchmarks.harness import beir_directory, results_arguments
from benchmarks.run import checked_commit, machine
from model_code.config import IndexParams
from model_code.data.beir import read_beir
from model_code.data.ingested import passage_texts
from model_code.io import tree_sha256, write_json
from model_code.layout import Layout
from model_code.methods.svdr.model import SparseEncoder
from model_code.methods.svdr.retriever import SparseEncoderHandle, SVDRRetriever, SVDRSettings
from model_code.methods.svdr.token_bags import bag_of_tokens
from model_code.models.encoder import Encoder, resolve_model_path
from model_code.retrievers.base import UpdateContext
from model_code.stores.csr_store import CsrStore
from model_code.stores.faiss_store import FaissStore

MODES = (("full", {"search": "full"}), ("alpha", {"search": "alpha"}), ("beta", {"search": "beta"}),
         ("beta_rerank10", {"search": "beta_rerank", "rerank_depth": 10}),
         ("beta_rerank100", {"search": "beta_rerank", "rerank_depth": 100}))


def load() -> float:
    """The machine's 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def directory_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 2**20


def csr_mb(matrix: sp.csr_matrix) -> float:
    return (matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes) / 2**20


def timed(function, repeats: int = 1) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls of ``function`` and its last result."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def binary_build(tokenizer, texts: list[str], doc_ids: list[str], length: int, settings: SVDRSettings,
                 vocab_size: int, repeats: int, workdir: Path) -> dict:
    """Documents/s and MB of the binary token index of ``texts`` at ``length`` tokens."""
    before = load()
    seconds, matrix = timed(lambda: bag_of_tokens(tokenizer, texts, length, settings.vocab_start, vocab_size), repeats)
    directory = workdir / f"binary-{length}-{len(texts)}"
    CsrStore.build(matrix, doc_ids).save(directory)
    return {"documents": len(texts), "seconds": round(seconds, 4), "docs_per_s": round(len(texts) / seconds, 2),
            "repeats": repeats, "tokens_per_document": round(matrix.nnz / len(texts), 1),
            "memory_mb": round(csr_mb(matrix), 3), "disk_mb": round(directory_mb(directory), 3), "load_before": before}


def dense_build(encoder: Encoder, texts: list[str], doc_ids: list[str], length: int, batch_size: int, factory: str,
                workdir: Path) -> dict:
    """Documents/s and MB of the dense kind's FAISS index of ``texts`` at ``length`` tokens."""
    before = load()
    start = time.perf_counter()
    vectors = encoder.encode(texts, length, batch_size)
    encoded = time.perf_counter()
    index = FaissStore.build(vectors, doc_ids, IndexParams(factory=factory, use_gpu="never"))
    seconds = time.perf_counter() - start
    directory = workdir / f"dense-{length}"
    index.save(directory)
    return {"documents": len(texts), "seconds": round(seconds, 4), "docs_per_s": round(len(texts) / seconds, 2),
            "encode_seconds": round(encoded - start, 4), "factory": factory, "dimension": int(vectors.shape[1]),
            "memory_mb": round(vectors.nbytes / 2**20, 3), "disk_mb": round(directory_mb(directory), 3),
            "load_before": before}


def additions(handle: SparseEncoderHandle, corpus: pd.DataFrame, added: int, batch_sizes: tuple[int, ...],
              context: UpdateContext, seed: int) -> dict:
    """ms per added document through the kind's ``add`` (search beta) onto the corpus minus the
    ``added`` documents, per batch size: each batch size starts from the same index."""
    order = np.random.default_rng(seed + 1).permutation(len(corpus))
    new, old = corpus.iloc[order[:added]], corpus.iloc[order[added:]]
    base = handle.tokens(passage_texts(old), "passage")
    out = {"index_documents": len(old), "added_documents": added}
    for size in batch_sizes:
        retriever = SVDRRetriever(CsrStore.build(base.copy(), old["doc_id"].tolist()), handle)
        before, per_document = load(), []
        for start in range(0, added, size):
            batch = new.iloc[start : start + size]
            begin = time.perf_counter()
            retriever.add(batch, context)
            per_document.append(1000 * (time.perf_counter() - begin) / len(batch))
        assert len(retriever.live_ids()) == len(corpus)
        out[f"batch_{size}"] = {"batches": len(per_document), "ms_per_doc_median": round(statistics.median(per_document), 3),
                                "ms_per_doc_p95": round(float(np.percentile(per_document, 95)), 3),
                                "ms_per_doc_mean": round(statistics.fmean(per_document), 3), "load_before": before}
    return out


def query_latency(model_dir: str, settings: SVDRSettings, lengths: dict, texts: list[str], doc_ids: list[str],
                  queries: list[str]) -> dict:
    """Median and mean ms per query (one query per call) of each search mode over ``texts``."""
    model = SparseEncoder(model_dir, settings.vocab_start, settings.shared_encoder)
    handles = {name: SparseEncoderHandle(Path(model_dir), settings.model_copy(update=update), lengths)
               for name, update in MODES}
    for handle in handles.values():
        handle.__dict__["model"] = model  # one model for every mode (a cached property)
    full_index = handles["full"].index_rows(texts)
    binary_index = handles["beta"].index_rows(texts)
    out = {"index_documents": len(texts), "queries": len(queries)}
    for name, handle in handles.items():
        matrix = full_index if handle.settings.search in ("full", "alpha") else binary_index
        passages = dict(zip(doc_ids, texts)) if handle.settings.search == "beta_rerank" else None
        retriever = SVDRRetriever(CsrStore.build(matrix, doc_ids), handle, passages)
        retriever.search(queries[:1], 10)  # warm-up
        before, ms = load(), []
        for query in queries:
            start = time.perf_counter()
            retriever.search([query], 10)
            ms.append(1000 * (time.perf_counter() - start))
        out[name] = {"ms_median": round(statistics.median(ms), 2), "ms_mean": round(statistics.fmean(ms), 2),
                     "load_before": before}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.svdr_index", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="BEIR directory")
    results_arguments(parser)
    parser.add_argument("--sample", type=int, default=1000, help="documents encoded by both (0: the whole corpus)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="passage lengths in tokens (default: 256 and encoder.max_passage_length)")
    parser.add_argument("--repeats", type=int, default=3, help="timings of each binary build (median)")
    parser.add_argument("--added", type=int, default=200, help="documents added on the freshness path")
    parser.add_argument("--queries", type=int, default=20, help="test queries per search mode (0: no latency)")
    parser.add_argument("--model", default=None, help="encoder.model override (tests: a tiny model)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.data = beir_directory(parser, args.data)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    overrides = {"retriever": {"kind": "svdr"}, **({"encoder": {"model": args.model}} if args.model else {})}
    params = resolve_params(overrides, args.data.resolve())
    lengths = args.lengths or sorted({256, params.encoder.max_passage_length}, reverse=True)
    if 256 not in lengths:
        parser.error("--lengths must include 256: build_speedup_vs_dense is measured there")
    start_load = load()
    raw = read_beir(args.data)
    corpus = raw.corpus.sort_values("doc_id").reset_index(drop=True)
    size = len(corpus) if args.sample <= 0 else min(args.sample, len(corpus))
    sample = corpus.iloc[np.sort(np.random.default_rng(args.seed).choice(len(corpus), size, replace=False))]
    texts, doc_ids = passage_texts(sample), sample["doc_id"].tolist()
    all_texts, all_ids = passage_texts(corpus), corpus["doc_id"].tolist()

    model_dir = resolve_model_path(params.encoder.model)
    settings = params.retriever.settings("svdr").model_copy(update={"search": "beta"})
    handle = SparseEncoderHandle(Path(model_dir), settings, params.encoder.model_dump())
    tokenizer, vocab_size = handle.tokenizer, handle.vocab_size
    bag_of_tokens(tokenizer, texts[:64], 256, settings.vocab_start, vocab_size)  # warm-up
    dense = Encoder(model_dir, params.encoder.pooling)
    dense.encode(texts[:8], 32, params.encoder.batch_size)  # warm-up
    builds, metrics = {}, {}
    with tempfile.TemporaryDirectory(prefix="svdr-index-") as tmp:
        workdir = Path(tmp)
        for length in lengths:
            row = {"binary": binary_build(tokenizer, texts, doc_ids, length, settings, vocab_size, args.repeats, workdir),
                   "binary_whole_corpus": binary_build(tokenizer, all_texts, all_ids, length, settings, vocab_size,
                                                       args.repeats, workdir),
                   "dense": dense_build(dense, texts, doc_ids, length, params.encoder.batch_size,
                                        params.index.factory, workdir)}
            b, d = row["binary"], row["dense"]
            row["build_speedup_vs_dense"] = round(b["docs_per_s"] / d["docs_per_s"], 2)
            row["size_ratio_dense_over_binary_disk"] = round(d["disk_mb"] / b["disk_mb"], 2)
            builds[str(length)] = row
            suffix = "" if length == 256 else f"_at_{length}"
            metrics[f"build_speedup_vs_dense{suffix}"] = row["build_speedup_vs_dense"]
            metrics[f"binary_docs_per_s{suffix or '_at_256'}"] = b["docs_per_s"]
            metrics[f"dense_docs_per_s{suffix or '_at_256'}"] = d["docs_per_s"]
            metrics[f"binary_disk_mb{suffix or '_at_256'}"] = b["disk_mb"]
            metrics[f"dense_disk_mb{suffix or '_at_256'}"] = d["disk_mb"]
            print(f"{length:>4} tokens: binary {b['docs_per_s']:>9.1f} docs/s {b['disk_mb']:.3f} MB | dense "
                  f"{d['docs_per_s']:>7.1f} docs/s {d['disk_mb']:.3f} MB | speedup {row['build_speedup_vs_dense']:.1f}x",
                  flush=True)
        del dense
        context = UpdateContext(params, Layout(workdir / "workspace"))
        fresh = additions(handle, corpus, min(args.added, len(corpus) // 2), (20, 1), context, args.seed)
    for batch in (20, 1):
        metrics[f"add_ms_per_doc_batch_{batch}"] = fresh[f"batch_{batch}"]["ms_per_doc_median"]
    print(f"add: {metrics['add_ms_per_doc_batch_20']:.3f} ms/doc in batches of 20, "
          f"{metrics['add_ms_per_doc_batch_1']:.3f} ms/doc one at a time", flush=True)
    latency = None
    if args.queries > 0:
        test_ids = set(raw.qrels["test"]["query_id"]) if "test" in raw.qrels else set(raw.queries["query_id"])
        queries = raw.queries[raw.queries["query_id"].isin(test_ids)].sort_values("query_id")["text"].tolist()
        latency = query_latency(model_dir, settings, params.encoder.model_dump(), texts, doc_ids,
                                queries[: args.queries])
        for name, _ in MODES:
            metrics[f"query_ms_{name}"] = latency[name]["ms_median"]
            print(f"query {name:<15} {latency[name]['ms_median']:>8.1f} ms", flush=True)
    dataset = args.data.resolve().name
    result = {
        "dataset": dataset,
        "config": "svdr-index",
        "metrics": metrics,
        "builds": builds,
        "additions": fresh,
        "query_latency": latency,
        "sample": {"documents": size, "corpus_documents": len(corpus), "seed": args.seed,
                   "description": f"binary and dense builds on the same {size} documents drawn at random (seed "
                                  f"{args.seed}) from the {len(corpus)}; binary_whole_corpus indexes all of them; "
                                  "query latency over the sample indexed at the project's passage length"},
        "threads": {"torch": torch.get_num_threads(), "cpus": os.cpu_count(), "niceness": os.nice(0),
                    "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "unset")},
        "load_average": {"start": start_load, "end": load()},
        "machine": machine(),
        "date": dt.date.today().isoformat(),
        "commit": commit,
        "dirty": commit.endswith("+dirty"),
        "params": params.model_dump(mode="json"),
        "dataset_sha256": tree_sha256(args.data.resolve()),
    }
    write_json(args.out / dataset / "svdr-index.json", result)
    print(f"load average: {start_load} at the start, {result['load_average']['end']} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
