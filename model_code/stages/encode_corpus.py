"""Stage ``encode-corpus``: the corpus encoded ahead of the index stage, in ``data.shards``
contiguous shards, into the embedding cache (``models/embedding_cache.py``).

Why: encoding is the cost that grows with the corpus (about 20 documents a second on 2 cores
with MiniLM), and one pass over a million documents is a 14-hour job that a crash restarts from
zero. Each shard is its own unit of work: ``fresh-retriever encode-corpus --shard i/n`` runs one
(without ``--shard``, every shard in turn), the Dagster asset ``corpus_shards`` has one partition
per shard (each retried alone, launched in parallel by the instance's run coordinator: processes
here, pods on Kubernetes), DVC has one ``encode-corpus@i`` stage per shard. The kind says how its
build encodes documents (``Retriever.corpus_encoding``), so the vectors are exactly the ones the
index stage (the merge) then reads from the cache instead of encoding; it encodes only what no
shard did. A shard run again re-encodes nothing it finished: the cache keeps every text encoded,
written in chunks as a pass goes, so even a shard killed half-way keeps its finished chunks.
"""

from __future__ import annotations

import itertools
import time

from model_code.config import Params
from model_code.data.ingested import load_ingested
from model_code.io import write_json
from model_code.layout import Layout
from model_code.retrievers import kind_class


def shard_bounds(documents: int, shards: int) -> list[tuple[int, int]]:
    """Row ranges [start, end) of ``shards`` contiguous shards of ``documents`` rows, sizes within one."""
    return list(itertools.pairwise(i * documents // shards for i in range(shards + 1)))


REGENERATE_DVC = "regenerate dvc.yaml (python -m model_code.stages.pipeline > dvc.yaml) after changing it"


def parse_shard(text: str, params: Params, fix: str = REGENERATE_DVC) -> int:
    """``i/n`` of ``--shard``: shard ``i`` of ``n``, where ``n`` must be ``data.shards`` (a DVC file
    generated for another shard count would otherwise leave documents out); ``fix`` says how to
    make the counts agree where the shards came from."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected i/n, e.g. 0/4") from None
    if count != params.data.shards:
        raise ValueError(f"--shard {text}: data.shards is {params.data.shards}; {fix}")
    if not 0 <= index < count:
        raise ValueError(f"--shard {text}: i must be between 0 and {count - 1}")
    return index


def run(params: Params, layout: Layout, shard: int | None = None) -> dict:
    """Encode shard ``shard`` (None: every shard in turn) of the ingested corpus."""
    corpus = load_ingested(layout.ingested).corpus
    kind = params.retriever.kind
    encode = kind_class(kind).corpus_encoding(params, layout)
    bounds = shard_bounds(len(corpus), params.data.shards)
    done = []
    for index in range(params.data.shards) if shard is None else [shard]:
        start, end = bounds[index]
        began = time.perf_counter()
        if encode is not None:
            encode(corpus.iloc[start:end])
        report = {"shard": index, "shards": params.data.shards, "first_row": start, "documents": end - start,
                  "kind": kind, "encoded": encode is not None, "seconds": time.perf_counter() - began}
        write_json(layout.shard_reports / f"{index}.json", report)
        done.append(report)
    return {"kind": kind, "shards": [r["shard"] for r in done], "documents": sum(r["documents"] for r in done),
            "encoded": encode is not None, "seconds": sum(r["seconds"] for r in done)}
