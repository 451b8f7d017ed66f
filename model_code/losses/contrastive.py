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
    hard_negatives, hard_excluded: (N, d) mined negatives of the global batch (training/negatives.py),
        candidates of every query on the query->passage side, and the (B_global, N) bool mask of
        those that are not a negative of a query (relevant to it, or padding).

``scored_infonce`` is the same loss from score matrices, for scores that are not one inner product
(MLR's multi-layer documents).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    hard_negatives: torch.Tensor | None = None,
    hard_excluded: torch.Tensor | None = None,
) -> torch.Tensor:
    all_queries = queries if all_queries is None else all_queries
    all_passages = passages if all_passages is None else all_passages
    added = []
    if extra is not None and extra.shape[1] > 0:
        sampled = torch.einsum("bd,bkd->bk", queries, extra) / temperature
        if extra_mask is not None:
            sampled = sampled.masked_fill(~extra_mask.to(sampled.device), float("-inf"))
        added.append(sampled)
    if hard_negatives is not None:
        added.append(scored_hard(queries @ hard_negatives.T / temperature, hard_excluded, offset))
    return scored_infonce(queries @ all_passages.T / temperature, passages @ all_queries.T / temperature, offset,
                          false_negatives, added)


def scored_hard(scores: torch.Tensor, excluded: torch.Tensor, offset: int) -> torch.Tensor:
    """Scores (B, N) of this rank's queries against the hard negatives, excluded ones at -inf."""
    return scores.masked_fill(excluded[offset : offset + len(scores)].to(scores.device), float("-inf"))


def scored_infonce(forward: torch.Tensor, backward: torch.Tensor, offset: int = 0,
                   false_negatives: torch.Tensor | None = None, added: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """The bidirectional loss of this rank's rows from scores already divided by the temperature:
    ``forward`` (B, B_global) query->passage, ``backward`` (B, B_global) passage->query, row i's
    target at column ``offset + i``; ``added`` further (B, n) query->passage candidates."""
    targets = torch.arange(len(forward), device=forward.device) + offset
    if false_negatives is not None:
        known = false_negatives.to(forward.device)
        rows = slice(offset, offset + len(forward))
        forward = forward.masked_fill(known[rows], float("-inf"))
        backward = backward.masked_fill(known.T[rows], float("-inf"))
    forward = torch.cat([forward, *added], dim=1)
    return F.cross_entropy(forward, targets) + F.cross_entropy(backward, targets)
