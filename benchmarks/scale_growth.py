"""More growth curves (issue 47, item 4): SVDR's binary token index and the drift report against
corpus size, with ``benchmarks.scale``'s harness (sizes, ``--cap``, ``--max-size``, exponents,
results files).

    python -m benchmarks.scale_growth token-index [--sizes 10000 100000 1000000] [--cap 300]
    python -m benchmarks.scale_growth drift [--sizes 10000 100000 1000000] [--max-size ...]

``token-index`` (writes ``token_index.{json,md,png}``): the index of kind ``svdr`` with
``search: beta``, built as ``SVDRRetriever.build`` builds it (``SparseEncoderHandle.index_rows``:
the bundled MiniLM's BERT tokenizer through ``token_bags.bag_of_tokens``, cut at the resolved
``encoder.max_passage_length``; then the ``sparse`` store's ``build``) and searched as
``SVDRRetriever.search`` searches it (the store's ``search`` for the top 10, one query at a time after a
warm-up, up to ``--queries`` or ``--query-seconds``). The texts are synthetic (``zipf_bags``): about ``--length`` words per document, each a
vocabulary token drawn from a Zipf distribution over the vocabulary (texts, not id lists, because
the real path starts from text). Two query shapes, since beta's query side needs the trained
sparse encoder (not bundled) and only its output's shape matters to the index: ``query``, the
binary bag of a ``--query-length``-word text (T(q), as ``alpha`` queries); ``query_topk``,
``svdr.topk`` distinct tokens drawn from the same distribution with random positive weights (the
shape of the encoded query E(q) that ``beta`` searches with). ``index_bytes``: the CSR arrays.

``drift`` (writes ``drift.{json,md,png}``): ``freshness.drift.build_reference`` over a deployed
``faiss`` Flat index of ``benchmarks.scale``'s synthetic vectors, once with each tree builder
(the configured hierarchy's is the default, agglomerative), and the scoring of one batch of
``--batch`` new vectors as ``freshness.report.run`` scores it once the batch is embedded
(``volume_statistics``, ``index_with``, ``vector_statistics``, ``decide``; median of
``--repeats``). The canary is synthetic: ``--canary-pool`` queries from the vectors' mixture in a
``dev`` split, each answered by its exact nearest document, of which ``freshness.canary_queries``
are drawn. Not timed: embedding the batch (encoding, see ``benchmarks.sharded_encoding``) and
loading the retriever versions from disk.

Refused from uncommitted code unless ``--allow-dirty`` (as ``benchmarks.run``).
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from benchmarks.run import checked_commit
from benchmarks.scale import (
    DATA,
    OUT,
    K,
    add_growth_arguments,
    exact_top_k,
    grow,
    growth_report,
    largest_sizes,
    synthetic,
    write_report,
)
from model_code.config import EncoderParams, FreshnessParams, HierarchyParams, IndexParams
from model_code.data.ingested import IngestedData
from model_code.freshness.drift import (
    build_reference,
    decide,
    index_with,
    vector_statistics,
    volume_statistics,
)
from model_code.methods.svdr.retriever import SparseEncoderHandle, SVDRSettings
from model_code.models.encoder import DEFAULT_MODEL, resolve_model_path
from model_code.stores import store_class


def zipf_bags(documents: int, mean_length: float, vocabulary: int, rng: np.random.Generator,
              exponent: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic bags of tokens: (offsets, ranks), document i's token ranks being
    ``ranks[offsets[i]:offsets[i + 1]]``, its length Poisson(``mean_length``) (at least 1), each
    rank in [0, ``vocabulary``) drawn with probability proportional to 1 / (rank + 1) ** exponent
    (rank 0 the most frequent). Same generator state, same bags."""
    lengths = np.maximum(rng.poisson(mean_length, documents), 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    weights = 1.0 / np.arange(1, vocabulary + 1) ** exponent
    cdf = np.cumsum(weights / weights.sum())
    ranks = np.minimum(np.searchsorted(cdf, rng.random(int(offsets[-1])), side="right"), vocabulary - 1)
    return offsets, ranks.astype(np.int32)


def render(offsets: np.ndarray, ranks: np.ndarray, words: np.ndarray) -> list[str]:
    """Each bag as a text: its ranks' words joined by spaces."""
    chosen = words[ranks]
    return [" ".join(chosen[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]


def vocabulary_words(handle: SparseEncoderHandle, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(words, columns): the index's tokens (ids from ``vocab_start`` on) as words in a random
    frequency order, and each rank's index column (its id less ``vocab_start``). Random, because
    BERT's id order puts about 1,000 single characters first, which would make most words one
    character. A word piece's ``##`` is dropped (the tokenizer reads the piece as a word)."""
    start = handle.settings.vocab_start
    tokens = handle.tokenizer.convert_ids_to_tokens(range(start, start + handle.vocab_size))
    columns = rng.permutation(handle.vocab_size)
    return np.array([t.removeprefix("##") for t in tokens], dtype=object)[columns], columns


def weighted_queries(queries: int, nonzeros: int, columns: np.ndarray, rng: np.random.Generator) -> sp.csr_matrix:
    """Rows shaped as an encoded query E(q): ``nonzeros`` distinct columns each, drawn by the same
    Zipf distribution over ranks as the texts' words (rank r is column ``columns[r]``), weights
    uniform in [0.1, 3]."""
    weights = 1.0 / np.arange(1, len(columns) + 1)
    drawn = [np.sort(columns[rng.choice(len(columns), nonzeros, replace=False, p=weights / weights.sum())])
             for _ in range(queries)]
    return sp.csr_matrix((rng.uniform(0.1, 3.0, queries * nonzeros).astype(np.float32), np.concatenate(drawn),
                          np.arange(0, queries * nonzeros + 1, nonzeros)), shape=(queries, len(columns)))


def latencies(search, queries: sp.csr_matrix, budget: float, minimum: int = 10) -> dict[str, float]:
    """p50 / p99 milliseconds of ``search`` on each query row alone, after one warm-up search; rows
    are timed in order until ``budget`` seconds are spent (at least ``minimum`` rows): the exact
    search scans the whole index, seconds per query at a million documents."""
    search(queries[:1])
    times: list[float] = []
    began = time.perf_counter()
    for i in range(queries.shape[0]):
        if len(times) >= minimum and time.perf_counter() - began > budget:
            break
        row = queries[i]
        start = time.perf_counter()
        search(row)
        times.append((time.perf_counter() - start) * 1000)
    ordered = sorted(times)
    return {"p50_ms": statistics.median(times), "p99_ms": ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)],
            "queries": len(times)}


def measure_token_index(handle: SparseEncoderHandle, texts: list[str], queries: sp.csr_matrix,
                        topk_queries: sp.csr_matrix, budget: float) -> dict:
    """Build the beta index of ``texts`` as ``SVDRRetriever.build`` does and time its searches."""
    start = time.perf_counter()
    matrix = handle.index_rows(texts)
    tokenised = time.perf_counter() - start
    index = store_class(IndexParams().backend, "sparse").build(matrix, [str(i) for i in range(len(texts))], IndexParams())
    built = time.perf_counter() - start
    search = functools.partial(index.search, k=K)  # by id, as SVDRRetriever.search asks (row numbers before 55be239)
    binary, weighted = latencies(search, queries, budget), latencies(search, topk_queries, budget)
    return {"seconds": built, "tokenise_seconds": tokenised, "nonzeros_per_document": matrix.nnz / len(texts),
            "index_bytes": (size := int(index.matrix.data.nbytes + index.matrix.indices.nbytes
                                        + index.matrix.indptr.nbytes)), "index_mb": size / 2**20,
            "query_p50_ms": binary["p50_ms"], "query_p99_ms": binary["p99_ms"],
            "query_topk_p50_ms": weighted["p50_ms"], "query_topk_p99_ms": weighted["p99_ms"],
            "queries_timed": binary["queries"], "topk_queries_timed": weighted["queries"]}


def token_index(args: argparse.Namespace, commit: str) -> None:
    settings = SVDRSettings(search="beta")
    encoder = EncoderParams()  # lengths resolved to the bundled model's limit (256), as a build gets them
    handle = SparseEncoderHandle(Path(resolve_model_path(DEFAULT_MODEL)), settings, encoder.model_dump())
    rng = np.random.default_rng(args.seed)
    words, columns = vocabulary_words(handle, rng)
    queries = handle.tokens(render(*zipf_bags(args.queries, args.query_length, len(words), rng), words), "query")
    topk_queries = weighted_queries(args.queries, settings.topk, columns, rng)

    def runs_for(n: int) -> dict:
        texts = render(*zipf_bags(n, args.length, len(words), rng), words)
        return {"token-index": functools.partial(measure_token_index, handle, texts, queries, topk_queries,
                                                    args.query_seconds)}

    params = {"retriever": {"kind": "svdr", "svdr": settings.model_dump()}, "encoder": encoder.model_dump(),
              "index": IndexParams().model_dump()}
    data = (f"synthetic texts: about {args.length} words per document and {args.query_length} per query, each word a "
            f"token of the bundled MiniLM's BERT vocabulary (ids {settings.vocab_start}-{settings.vocab_start + len(words) - 1}, "
            "'##' dropped) drawn from a Zipf distribution (exponent 1) over them in a random order; query_topk: "
            f"{settings.topk} distinct tokens per query from the same distribution, weights uniform in [0.1, 3]")
    columns = (("seconds", "build s", "{:.2f}"), ("tokenise_seconds", "of it tokenising s", "{:.2f}"),
               ("nonzeros_per_document", "tokens / doc", "{:.1f}"), ("index_mb", "index MiB", "{:.0f}"),
               ("query_p50_ms", "query p50 ms", "{:.2f}"), ("query_p99_ms", "query p99 ms", "{:.2f}"),
               ("query_topk_p50_ms", "topk query p50 ms", "{:.2f}"), ("query_topk_p99_ms", "topk query p99 ms", "{:.2f}"))
    panels = (("seconds", "build seconds", "build"), ("query_p99_ms", "query p99 ms (top 10, one query)", "search"),
              ("query_topk_p99_ms", "query p99 ms (top 10, one query)", f"search, {settings.topk}-token query"))
    largest = largest_sizes(args.max_size)
    grow(args.sizes, runs_for, args.cap, largest, lambda measures, stopped: write_report(args.out, growth_report(
        "token_index", commit, args, params, data, measures, stopped, largest,
        ("seconds", "query_p50_ms", "query_topk_p50_ms", "index_bytes")), columns, panels, "Binary token index growth"))


def drift_inputs(vectors: np.ndarray, pool: np.ndarray) -> tuple:
    """What ``build_reference`` reads, for synthetic vectors: the deployed index (``faiss`` Flat, the
    default), a ``dev`` split whose queries (``pool``) are each answered by their exact nearest
    document, and the function that embeds a canary query (its row of ``pool``)."""
    ids = [f"d{i}" for i in range(len(vectors))]
    index = store_class("faiss", "dense").build(vectors, ids, IndexParams(use_gpu="never"))
    query_ids = [f"q{i}" for i in range(len(pool))]
    nearest = exact_top_k(vectors, pool, 1)[:, 0]
    data = IngestedData(corpus=pd.DataFrame({"doc_id": ids}),
                        queries=pd.DataFrame({"query_id": query_ids, "text": query_ids}),
                        qrels={"dev": pd.DataFrame({"query_id": query_ids, "doc_id": [ids[i] for i in nearest],
                                                    "relevance": 1})})
    return index, data, lambda texts: pool[[int(text[1:]) for text in texts]]


def measure_reference(builder: str, inputs: dict, references: dict) -> dict:
    index, data, encode = inputs["inputs"]
    start = time.perf_counter()
    reference = build_reference(index, encode, data, HierarchyParams(builder=builder), FreshnessParams())
    references["reference"] = reference
    return {"seconds": time.perf_counter() - start, "centroids": len(reference.centroids),
            "canary_queries": len(reference.canary_qrels), "canary_mrr": reference.canary_at_training["mrr@10"]}


def measure_batch(batch: np.ndarray, repeats: int, inputs: dict, references: dict) -> dict:
    """Score one batch as ``freshness.report.run`` does once it is embedded (the first batch since
    the training snapshot: the cumulative vectors are the batch's)."""
    index, data, encode = inputs["inputs"]
    params = FreshnessParams()
    reference = references.get("reference") or build_reference(index, encode, data, HierarchyParams(builder="divisive"),
                                                                params)  # both reference measures stopped: untimed
    ids = [f"new{i}" for i in range(len(batch))]
    rows = []
    for _ in range(repeats):
        start = time.perf_counter()
        stats = volume_statistics(len(ids), len(ids), len(index.live_ids()))
        after = index_with(index, batch, ids)
        copied = time.perf_counter()
        stats.update(vector_statistics(reference, batch, batch, after))
        decision, _ = decide(stats, params.thresholds, params.min_batch_documents)
        end = time.perf_counter()
        rows.append({"seconds": end - start, "index_with_seconds": copied - start, "statistics_seconds": end - copied})
        del after
    return {**{key: statistics.median(r[key] for r in rows) for key in rows[0]}, "decision": decision,
            "batch_similarity_ks": stats["batch_similarity_ks"], "canary_mrr": stats["canary_mrr@10"]}


def drift(args: argparse.Namespace, commit: str) -> None:
    rng = np.random.default_rng(args.seed)
    centers = rng.standard_normal((args.clusters, args.dim))  # as benchmarks.scale draws its vectors
    pool = synthetic(args.canary_pool, centers, args.noise, rng)
    batch = synthetic(args.batch, centers, args.noise, rng)
    inputs, references = {}, {}

    def runs_for(n: int) -> dict:
        inputs.clear()  # the previous size's index and reference go first
        references.clear()
        inputs["inputs"] = drift_inputs(synthetic(n, centers, args.noise, rng), pool)
        return {"reference-agglomerative": functools.partial(measure_reference, "agglomerative", inputs, references),
                "reference-divisive": functools.partial(measure_reference, "divisive", inputs, references),
                "batch": functools.partial(measure_batch, batch, args.repeats, inputs, references)}

    largest = largest_sizes(args.max_size)
    params = {"index": IndexParams(use_gpu="never").model_dump(), "hierarchy": HierarchyParams().model_dump(),
              "freshness": FreshnessParams().model_dump()}
    data = (f"{DATA}; canary: {args.canary_pool} such queries, each relevant to its exact nearest document; the batch: "
            f"{args.batch} new vectors from the same mixture")
    columns = (("seconds", "seconds", "{:.2f}"), ("centroids", "top centroids", "{}"),
               ("index_with_seconds", "of it index_with s", "{:.2f}"),
               ("statistics_seconds", "of it vector_statistics s", "{:.2f}"), ("canary_mrr", "canary MRR@10", "{:.3f}"))
    panels = (("seconds", "seconds", "drift reference (build_reference) and one batch's scoring"),)
    grow(args.sizes, runs_for, args.cap, largest, lambda measures, stopped: write_report(args.out, growth_report(
        "drift", commit, args, params, data, measures, stopped, largest), columns, panels, "Drift report growth"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_growth", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tokens = commands.add_parser("token-index", help="SVDR's binary token index (beta)")
    add_growth_arguments(tokens, OUT)
    tokens.add_argument("--length", type=float, default=150, help="mean words per document")
    tokens.add_argument("--query-length", type=float, default=15, help="mean words per query")
    tokens.add_argument("--queries", type=int, default=200)
    tokens.add_argument("--query-seconds", type=float, default=60,
                        help="seconds of searches timed per query shape and size (at least 10 queries)")
    vectors = commands.add_parser("drift", help="the drift reference and one batch's drift statistics")
    add_growth_arguments(vectors, OUT)
    vectors.add_argument("--dim", type=int, default=384)
    vectors.add_argument("--clusters", type=int, default=1000, help="directions the vectors gather around")
    vectors.add_argument("--noise", type=float, default=0.6, help="per-coordinate noise around a cluster's direction")
    vectors.add_argument("--canary-pool", type=int, default=400, help="dev queries the canary is drawn from")
    vectors.add_argument("--batch", type=int, default=1000, help="documents in the scored batch")
    vectors.add_argument("--repeats", type=int, default=3, help="scorings of the batch (the median is kept)")
    args = parser.parse_args(argv)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    {"token-index": token_index, "drift": drift}[args.command](args, commit)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
