"""Bidirectional in-batch contrastive loss (InfoNCE), computed from embeddings.

Given L2-normalised query embeddings Q (B x d) and passage embeddings P (B x d) where P[i] is the
positive of Q[i], the score matrix is S = Q P^T / tau and the loss averages the query->passage
cross-entropy over rows and the passage->query cross-entropy over columns (HCE App. A):

    L = 1/2 [ CE(S, diag) + CE(S^T, diag) ]

Every other passage in the batch is a negative for a query, and vice versa.

Args:
    temperature: tau; MiniLM-style encoders train well at 0.05, HCE uses 0.01.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bidirectional_infonce(queries: torch.Tensor, passages: torch.Tensor, temperature: float) -> torch.Tensor:
    scores = queries @ passages.T / temperature
    targets = torch.arange(len(queries), device=scores.device)
    return 0.5 * (F.cross_entropy(scores, targets) + F.cross_entropy(scores.T, targets))
