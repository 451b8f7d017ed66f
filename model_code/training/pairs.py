"""Training pairs (query text, positive passage) and batches without duplicate passages.

A passage appearing twice in a batch would be its own in-batch negative (a false negative), so
batches are packed greedily from a seeded shuffle, skipping pairs whose passage is already in
the batch being filled (they go to the next batch). A query with several relevant documents
(10% of SciFact's train queries) has the same problem across pairs: every pair carries the set
of its query's ``positives``, and ``false_negatives`` marks which in-batch passages the loss must
not count as negatives of which query.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import torch

from model_code.data.ingested import IngestedData


def supervised_pairs(data: IngestedData, split: str = "train") -> pd.DataFrame:
    """A pair per relevant judgement whose document is in the corpus: a qrel naming a missing one is
    kept for evaluation (BEIR's convention) but has no passage to train on."""
    qrels = data.qrels_for(split)
    qrels = qrels[(qrels["relevance"] > 0) & qrels["doc_id"].isin(data.corpus["doc_id"])]
    query_text = dict(zip(data.queries["query_id"], data.queries["text"]))
    return with_positives(
        pd.DataFrame({"query": qrels["query_id"].map(query_text).to_numpy(), "doc_id": qrels["doc_id"].to_numpy()})
    )


def pseudo_pairs(pseudo_queries: pd.DataFrame) -> pd.DataFrame:
    return with_positives(
        pd.DataFrame({"query": pseudo_queries["text"].to_numpy(), "doc_id": pseudo_queries["doc_id"].to_numpy()})
    )


def with_positives(pairs: pd.DataFrame) -> pd.DataFrame:
    """Add ``positives``: the frozenset of every document paired with the row's query text."""
    known = pairs.groupby("query", sort=False)["doc_id"].agg(frozenset)
    return pairs.assign(positives=pairs["query"].map(known))


def false_negatives(batch: pd.DataFrame) -> torch.Tensor:
    """(B, B) bool: entry (i, j) is set when passage j, though paired with another row, is a
    positive of query i, so row i must not treat it as a negative (the diagonal is the target)."""
    docs = batch["doc_id"].tolist()
    mask = torch.tensor([[doc in positives for doc in docs] for positives in batch["positives"]], dtype=torch.bool)
    return mask.fill_diagonal_(False)


def batches(pairs: pd.DataFrame, batch_size: int, seed: int) -> Iterator[pd.DataFrame]:
    """Endless stream of batches; each pass is a new shuffle, no passage twice in a batch."""
    if pairs["doc_id"].nunique() < batch_size:
        raise ValueError(f"need at least {batch_size} distinct positive documents, have {pairs['doc_id'].nunique()}")
    rng = np.random.default_rng(seed)
    pending: list[int] = []
    while True:
        pending.extend(rng.permutation(len(pairs)).tolist())
        while len(pending) >= batch_size:
            chosen, seen, rest = [], set(), []
            for i in pending:
                doc = pairs["doc_id"].iat[i]
                if len(chosen) < batch_size and doc not in seen:
                    chosen.append(i)
                    seen.add(doc)
                else:
                    rest.append(i)
            if len(chosen) < batch_size:
                break
            pending = rest
            yield pairs.iloc[chosen]
