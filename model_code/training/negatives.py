"""Hard negatives for training: each step draws ``train.hard_negatives`` documents per row of the
batch from its query's mined pool (the mine-negatives stage), uniformly without replacement, as
DPR and MLR draw one of the top-100 BM25 results per query.

The drawn documents join the batch's candidates: every query of the (global) batch scores them
besides the in-batch positives, as the MLR reference code does, so one step sees B·k more
negatives for B·k more passage encodings. A drawn document must not count as a negative of a
query it is relevant to (another row's negative can be this row's positive), and a row whose pool
has fewer than k documents is padded; ``excluded`` marks both.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch


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
        """(doc ids, excluded): k ids per row of ``batch``, row after row (B·k), and the (B, B·k)
        bool mask set where candidate c must not be a negative of row i: it is relevant to row i's
        query, or padding. A row without a pool pads with its own positive (its text is at hand)."""
        ids, padding = [], []
        for query, doc_id, positives in zip(batch["query"], batch["doc_id"], batch["positives"]):
            pool = [d for d in self.pools.get(query, ()) if d not in positives]
            drawn = [pool[i] for i in self.rng.choice(len(pool), min(self.count, len(pool)), replace=False)]
            ids += drawn + [doc_id] * (self.count - len(drawn))
            padding += [False] * len(drawn) + [True] * (self.count - len(drawn))
        excluded = torch.tensor([[pad or d in positives for d, pad in zip(ids, padding)]
                                 for positives in batch["positives"]], dtype=torch.bool).reshape(len(batch), len(ids))
        return ids, excluded
