"""Hard negatives for training: each step draws ``train.hard_negatives`` documents per row of the
batch from its query's mined pool (the mine-negatives stage), uniformly without replacement, as
DPR and MLR draw one of the top-100 BM25 results per query.

The drawn documents join the batch's candidates: every query of the (global) batch scores them
besides the in-batch positives, as the MLR reference code does, so one step sees B·k more
negatives for B·k more passage encodings. A drawn document must not count as a negative of a
query it is relevant to (another row's negative can be this row's positive), and a row whose pool
has fewer than k documents is padded; ``excluded`` marks both.

``RetrievedNegatives`` draws the same way from pools found during training instead (SVDR's
in-training negative retrieval, kind ``svdr``): each step, the top non-relevant documents of the
binary token index for the current query vectors.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from model_code.stores import VectorStore


class HardNegatives:
    """Args:
        mined: the mine-negatives stage's negatives (columns ``query``, ``doc_id``), keyed by query
            text as the training pairs are.
        count: k, the negatives drawn per row.
        seed: the draws' seed (every rank of a torchrun job draws the same).
    """

    def __init__(self, mined: pd.DataFrame, count: int, seed: int):
        self.pools = {query: docs.tolist() for query, docs in mined.groupby("query", sort=False)["doc_id"]}
        self.count = count
        self.rng = np.random.default_rng(seed)

    def draw(self, batch: pd.DataFrame) -> tuple[list[str], torch.Tensor]:
        """(doc ids, excluded) as ``draw_from_pools`` returns them, from each row's mined pool. A row
        without a pool (a query never mined) is padding only."""
        return draw_from_pools([self.pools.get(query, ()) for query in batch["query"]], batch, self.count, self.rng)


class RetrievedNegatives:
    """SVDR's in-training negative retrieval (the reference's ``ret_negatives``): each step, every
    query of the batch searches the binary token index of the training corpus with its current
    vector (beta: E(q)_k · T(d)); its ``depth`` best documents that are not relevant to it are its
    pool, and ``count`` are drawn from it as from a mined pool. The index is the tokenizer's, so it
    never goes stale as the encoder trains; only the query vectors change.

    Args:
        index: the binary token index of the corpus the training pairs' documents come from.
        count: negatives drawn per row (the reference's ``ret_negatives``).
        depth: the pool: the best non-relevant hits per query (the reference's ``ret_topk``).
        seed: the draws' seed (every rank of a torchrun job draws the same).
    """

    def __init__(self, index: VectorStore, count: int, depth: int, seed: int):
        self.index, self.count, self.depth = index, count, depth
        self.rng = np.random.default_rng(seed)

    def pools(self, batch: pd.DataFrame, queries: sp.csr_matrix) -> list[list[str]]:
        """Each row's ``depth`` best-scoring documents for its query vector (a row of ``queries``),
        best first, the query's relevant documents left out: searched deep enough to skip them all."""
        _, found = self.index.search(queries, self.depth + max(map(len, batch["positives"])))
        return [[d for d in ids if d not in positives][: self.depth] for ids, positives in zip(found, batch["positives"])]

    def draw(self, batch: pd.DataFrame, queries: sp.csr_matrix) -> tuple[list[str], torch.Tensor]:
        """(doc ids, excluded) as ``draw_from_pools`` returns them, from each row's ``pools``."""
        return draw_from_pools(self.pools(batch, queries), batch, self.count, self.rng)


def draw_from_pools(pools: list[Iterable[str]], batch: pd.DataFrame, count: int,
                    rng: np.random.Generator) -> tuple[list[str], torch.Tensor]:
    """(doc ids, excluded): ``count`` ids per row of ``batch`` drawn from its pool, row after row
    (B·k), and the (B, B·k) bool mask set where candidate c must not be a negative of row i: it is
    relevant to row i's query, or padding. A pool's documents relevant to its own row are never
    drawn; a row with fewer than k others pads with its own positive (its text is at hand)."""
    ids, padding = [], []
    for pool, doc_id, positives in zip(pools, batch["doc_id"], batch["positives"]):
        pool = [d for d in pool if d not in positives]
        drawn = [pool[i] for i in rng.choice(len(pool), min(count, len(pool)), replace=False)]
        ids += drawn + [doc_id] * (count - len(drawn))
        padding += [False] * len(drawn) + [True] * (count - len(drawn))
    excluded = torch.tensor([[pad or d in positives for d, pad in zip(ids, padding)]
                             for positives in batch["positives"]], dtype=torch.bool).reshape(len(batch), len(ids))
    return ids, excluded
