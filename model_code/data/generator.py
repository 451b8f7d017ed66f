"""Generated queries per document (docTTTTTquery-style, IncDSI App. A), cached by content.

With a seq2seq model configured, each document gets ``queries_per_document`` queries by top-k
sampling (batched, GPU when present). Without one, the fallback is extractive — the title and
inverse-cloze spans — and says so in the ``method`` column and the log. Queries produced for
more than one document are dropped (they cannot identify a document). Results are cached by a
hash of (generator settings, document text), so an incremental batch only generates for new or
changed documents.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from model_code.config import GeneratorParams
from model_code.io import write_parquet
from model_code.models.encoder import best_device

log = logging.getLogger(__name__)
COLUMNS = ["doc_id", "query", "method"]


def content_key(params: GeneratorParams, text: str) -> str:
    settings = json.dumps(params.model_dump(), sort_keys=True)
    return hashlib.sha256(f"{settings}\n{text}".encode()).hexdigest()


def seq2seq_queries(texts: list[str], params: GeneratorParams) -> list[list[str]]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    device = best_device()
    tokenizer = AutoTokenizer.from_pretrained(params.model, local_files_only=Path(params.model).exists())
    model = AutoModelForSeq2SeqLM.from_pretrained(params.model, local_files_only=Path(params.model).exists()).to(device)
    model.eval()
    torch.manual_seed(params.seed)
    out: list[list[str]] = []
    for start in tqdm(range(0, len(texts), params.batch_size), desc="generating queries", unit="batch"):
        batch = tokenizer(texts[start : start + params.batch_size], truncation=True, padding=True,
                          max_length=params.max_input_length, return_tensors="pt", return_token_type_ids=False).to(device)
        with torch.inference_mode():
            generated = model.generate(**batch, do_sample=True, top_k=params.top_k, max_length=params.max_length,
                                       num_return_sequences=params.queries_per_document)
        decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
        n = params.queries_per_document
        out.extend(decoded[i : i + n] for i in range(0, len(decoded), n))
    return out


def extractive_queries(titles: list[str], texts: list[str], params: GeneratorParams) -> list[list[str]]:
    rng = np.random.default_rng(params.seed)
    out = []
    for title, text in zip(titles, texts):
        words = text.split()
        span = min(params.max_length, len(words))
        starts = rng.integers(0, len(words) - span + 1, size=params.queries_per_document - bool(title))
        out.append(([title] if title else []) + [" ".join(words[s : s + span]) for s in starts])
    return out


def generate_queries(corpus: pd.DataFrame, params: GeneratorParams, cache_file: Path) -> pd.DataFrame:
    """Queries for every document of ``corpus``; only documents missing from the cache are generated."""
    cache = pd.read_parquet(cache_file) if cache_file.exists() else pd.DataFrame(columns=["key", "query", "method"])
    keys = [content_key(params, t) for t in corpus["text"]]
    missing = corpus[[k not in set(cache["key"]) for k in keys]]
    if len(missing):
        if params.model:
            fresh, method = seq2seq_queries(missing["text"].tolist(), params), "doc2query"
        else:
            log.warning("querygen.generator.model is not set: using extractive queries (title + spans)")
            fresh, method = extractive_queries(missing["title"].tolist(), missing["text"].tolist(), params), "extractive"
        added = pd.DataFrame(
            [{"key": content_key(params, text), "query": q, "method": method}
             for text, queries in zip(missing["text"], fresh) for q in queries]
        )
        cache = pd.concat([cache, added], ignore_index=True)
        write_parquet(cache_file, cache)
    log.info("generated queries for %d documents, %d from cache", len(missing), len(corpus) - len(missing))
    frame = pd.DataFrame({"doc_id": corpus["doc_id"].to_numpy(), "key": keys}).merge(cache, on="key")[COLUMNS]
    frame = frame[frame["query"].str.strip() != ""]
    owners = frame.groupby("query")["doc_id"].nunique()
    return frame[frame["query"].map(owners) == 1].drop_duplicates().reset_index(drop=True)
