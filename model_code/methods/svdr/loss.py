"""SVDR's semi-parametric contrastive loss (SVDR §4.2; the reference's ``compute_vdr_loss``).

With q, p the encoder's pooled vocabulary vectors of a batch's queries and passages (before
sparsification), bin_q, bin_p their binary bags of tokens and x_k = x ⊙ (top-k(x) ∨ bin_x):

    svdr:  L = ¼ [ ℓ(q_k, p) + ℓ(q, p_k) + ℓ(bin_q, p) + ℓ(q, bin_p) ]
    vdr:   L = ½ [ ℓ(q_k, p) + ℓ(bin_q, p) ]

The first two terms are parametric (one side sparsified, the other kept whole); the last two align
the parametric vectors with the binary ones, which is what lets a query search the binary token
index (beta) and a binary query search the embedding index (alpha).

ℓ(A, B) is the symmetric in-batch NLL at temperature 1: ½ [CE over each query's row of A·Bᵀ
(every passage of the global batch, positives then hard negatives) + CE over each positive
passage's row of B·Aᵀ (every query)]. The ½ follows the reference's stated loss; its code returns
the sum. A constant factor changes nothing under Adam(W) but the epsilon and gradient clipping.
"""

from __future__ import annotations

from typing import Literal

import torch

from model_code.losses.contrastive import bidirectional_infonce
from model_code.methods.svdr.model import sparsify


def symmetric_nll(a: torch.Tensor, b: torch.Tensor, rows: slice, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """ℓ(A, B) of the queries ``rows`` of the global batch. ``a``: (N, V) queries; ``b``: (N + n, V)
    passages, query i's positive at row i, then n hard negatives that every query scores;
    ``excluded``: (N, N + n) bool, (i, j) set when passage j is not a negative of query i (also
    relevant to it, or padding), left out of both directions."""
    return 0.5 * bidirectional_infonce(a[rows], b[rows], 1.0, a, b, rows.start, false_negatives=excluded)


def svdr_loss(q: torch.Tensor, p: torch.Tensor, bin_q: torch.Tensor, bin_p: torch.Tensor, topk: int | None,
              variant: Literal["svdr", "vdr"] = "svdr", rows: slice | None = None,
              excluded: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of this rank's ``rows`` (default: all) of a global batch laid out as in
    ``symmetric_nll``, and each term's value by name."""
    rows = slice(0, len(q)) if rows is None else rows
    q_k, p_k = sparsify(q, bin_q, topk), sparsify(p, bin_p, topk)
    pairs = {"q_k.p": (q_k, p), "bin_q.p": (bin_q, p)}
    if variant == "svdr":
        pairs |= {"q.p_k": (q, p_k), "q.bin_p": (q, bin_p)}
    terms = {name: symmetric_nll(a, b, rows, excluded) for name, (a, b) in pairs.items()}
    return torch.stack(list(terms.values())).mean(), {name: term.item() for name, term in terms.items()}
