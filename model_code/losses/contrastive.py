"""Bidirectional in-batch contrastive loss (InfoNCE), computed from embeddings.

Given L2-normalised query embeddings Q (B x d) and passage embeddings P (B x d) where P[i] is the
positive of Q[i], the score matrix is S = Q P^T / tau and the loss adds the query->passage
cross-entropy over rows and the passage->query cross-entropy over columns, each averaged over the
batch (HCE App. A, Eq. 8; no 1/2, so inside the HCE loss the retrieval term weighs what the paper's
does against the centroid levels):

    L = CE(S, diag) + CE(S^T, diag)

Every other passage in the batch is a negative for a query, and vice versa.

Args:
    temperature: tau; MiniLM-style encoders train well at 0.05, HCE uses 0.01.
    all_queries, all_passages, offset: for multi-process training, the all-gathered global
        batch and where this rank's rows start in it; the local rows are scored against the
        global batch so in-batch negatives span every rank (HCE footnote 3).
    extra, extra_mask: (B, k, d) additional negatives per query (e.g. HCE's sampled siblings),
        appended to the query->passage side only; masked entries are ignored.
    false_negatives: (B_global, B_global) bool over the global batch, (i, j) set when passage j
        is also relevant to query i; those scores are left out of both directions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bidirectional_infonce(
    queries: torch.Tensor,
    passages: torch.Tensor,
    temperature: float,
    all_queries: torch.Tensor | None = None,
    all_passages: torch.Tensor | None = None,
    offset: int = 0,
    extra: torch.Tensor | None = None,
    extra_mask: torch.Tensor | None = None,
    false_negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    all_queries = queries if all_queries is None else all_queries
    all_passages = passages if all_passages is None else all_passages
    targets = torch.arange(len(queries), device=queries.device) + offset
    forward = queries @ all_passages.T / temperature
    backward = passages @ all_queries.T / temperature
    if false_negatives is not None:
        known = false_negatives.to(queries.device)
        rows = slice(offset, offset + len(queries))
        forward = forward.masked_fill(known[rows], float("-inf"))
        backward = backward.masked_fill(known.T[rows], float("-inf"))
    if extra is not None and extra.shape[1] > 0:
        sampled = torch.einsum("bd,bkd->bk", queries, extra) / temperature
        if extra_mask is not None:
            sampled = sampled.masked_fill(~extra_mask.to(sampled.device), float("-inf"))
        forward = torch.cat([forward, sampled], dim=1)
    return F.cross_entropy(forward, targets) + F.cross_entropy(backward, targets)
