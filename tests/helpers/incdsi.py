"""A toy IncDSI problem: unit document vectors and noisy queries around them, and its query pairs;
and the addition loss written from the paper's formulas."""

import pandas as pd
import torch
import torch.nn.functional as F


def toy(n_docs=40, per_doc=4, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    docs = F.normalize(torch.randn(n_docs, d, generator=g), dim=-1)
    rows = torch.arange(n_docs).repeat_interleave(per_doc)
    queries = F.normalize(docs[rows] + 0.4 * torch.randn(len(rows), d, generator=g), dim=-1)
    return docs, [f"d{i}" for i in range(n_docs)], queries, rows


def toy_pairs(rows, ids, natural_per_doc):
    """(doc_id, query, natural) rows in ``toy`` order: the first ``natural_per_doc`` of each document natural."""
    rank = torch.cat([torch.arange((rows == r).sum()) for r in rows.unique()])
    return pd.DataFrame({"doc_id": [ids[r] for r in rows.tolist()], "query": [f"q{i}" for i in range(len(rows))],
                         "natural": (rank < natural_per_doc).tolist()})


def paper_loss(v, q_bar, best_other, z, own, lambda1, gamma1, gamma2, lambda2):
    """L(v) term by term, with Python loops (no shared code with the head or its optimiser)."""
    l1 = max(0.0, best_other + gamma1 - sum(a * b for a, b in zip(v, q_bar))) ** 2
    l2 = sum(max(0.0, sum(a * b for a, b in zip(v, row)) - o + gamma2) ** 2 for row, o in zip(z, own))
    return lambda1 * l1 + (1 - lambda1) * l2 + lambda2 * sum(a * a for a in v)
