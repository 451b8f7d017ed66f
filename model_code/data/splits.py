"""Deterministic splits: a dev split carved from train, and IncDSI's old/new/tune documents.

All assignments hash ``seed:id`` so they depend only on the ids and the seed, never on row
order or on the machine.
"""

from __future__ import annotations

import hashlib

import pandas as pd


def unit_hash(key: str, seed: int) -> float:
    """Map ``key`` to a stable pseudo-random number in [0, 1)."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def carve_dev(qrels: dict[str, pd.DataFrame], fraction: float, seed: int) -> dict[str, pd.DataFrame]:
    """Move ``fraction`` of the train *queries* (all their judgements) to a dev split, if none exists."""
    if "dev" in qrels or "train" not in qrels or fraction == 0:
        return qrels
    train = qrels["train"]
    is_dev = train["query_id"].map(lambda q: unit_hash(q, seed) < fraction)
    return {**qrels, "train": train[~is_dev].reset_index(drop=True), "dev": train[is_dev].reset_index(drop=True)}


def split_documents(doc_ids: pd.Series, fractions: dict[str, float], seed: int) -> pd.DataFrame:
    """Assign each document to old / new / tune by its hash rank (exact shares, stable per id)."""
    order = doc_ids.map(lambda d: unit_hash(d, seed)).argsort(kind="stable")
    n = len(doc_ids)
    n_old = round(n * fractions["old"])
    n_new = round(n * fractions["new"])
    labels = pd.Series("tune", index=range(n))
    labels.iloc[order[:n_old]] = "old"
    labels.iloc[order[n_old : n_old + n_new]] = "new"
    return pd.DataFrame({"doc_id": doc_ids.to_numpy(), "group": labels.to_numpy()})


def group_queries(qrels: dict[str, pd.DataFrame], doc_groups: pd.DataFrame) -> pd.DataFrame:
    """Each judged query belongs to the group of its relevant documents: ``new`` if any is new,
    else ``tune`` if any is tune, else ``old`` (so "old" queries never need a new document).
    A relevant document missing from the corpus (its qrel is kept for evaluation, as BEIR keeps
    it) is in no group, so a query with none in the corpus has no group either."""
    rank = {"old": 0, "tune": 1, "new": 2}
    group_of = dict(zip(doc_groups["doc_id"], doc_groups["group"]))
    rows = []
    for split, frame in qrels.items():
        relevant = frame[(frame["relevance"] > 0) & frame["doc_id"].isin(group_of)]
        for query_id, docs in relevant.groupby("query_id")["doc_id"]:
            group = max((group_of[d] for d in docs), key=rank.__getitem__)
            rows.append({"query_id": query_id, "split": split, "group": group})
    return pd.DataFrame(rows, columns=["query_id", "split", "group"])
