"""MLR's training loss over multi-layer documents (MLR §3; the reference code's ``compute_loss``,
described in ../shared/design/seed-reference.md §2.2), computed from layer vectors.

A document is m L2-normalised layer vectors h_1..h_m (h_1 the last layer), a query one vector q,
and s_j(q, d) = <q, h_j(d)>. ``retriever.mlr.pooling`` decides the score of a candidate:

* ``multi``: max_j s_j (Eq. 2, what the multi-vector index ranks by);
* ``mean``: mean_j s_j = <q, mean_j h_j> (average pooling);
* ``scalar_mix``: sum_j w_j s_j = <q, sum_j w_j h_j>, w = softmax of learned logits (``methods/mlr/layer_mix.py``);
* ``self_contrastive`` (Eq. 5-7): the positive scores s_1, the vector inference uses, and every
  other candidate max_j s_j; plus lambda times the cross-entropy over the positive's own layer
  scores with the last layer as the target (Eq. 6, the "self-contrastive" regulariser):

      L = L_cl + lambda * mean_i -log softmax_j( s_j(q_i, d_i) / tau )[1]

L_cl is the project's bidirectional in-batch loss (``contrastive.scored_infonce``) on these
scores over tau, with the mined hard negatives as further candidates of every query. The reference
code is one-directional with tau = tau_reg = 1 on raw dot products; here both directions (as the
+CT baseline this is compared with) and tau = tau_reg = ``train.temperature`` on cosines (unit
vectors: at tau = 1 the scores would span only [-1, 1] and the softmax would hardly care).
In the passage->query direction the positive pair again scores s_1 and the other queries max_j.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model_code.losses.contrastive import scored_hard, scored_infonce
from model_code.methods.mlr.layer_mix import ScalarMix


def layer_scores(queries: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
    """(B, N, m): s_j of each query (B, d) against each document's layer vectors (N, m, d)."""
    return torch.einsum("bd,nmd->bnm", queries, documents)


def pool(scores: torch.Tensor, pooling: str, mix: ScalarMix | None = None) -> torch.Tensor:
    """(B, N) candidate scores from layer scores (B, N, m); self_contrastive's non-positive rule (max)."""
    if pooling == "mean":
        return scores.mean(-1)
    if pooling == "scalar_mix":
        return mix(scores)
    return scores.amax(-1)


def mlr_infonce(
    queries: torch.Tensor,
    passages: torch.Tensor,
    temperature: float,
    pooling: str,
    all_queries: torch.Tensor | None = None,
    all_passages: torch.Tensor | None = None,
    offset: int = 0,
    false_negatives: torch.Tensor | None = None,
    hard_negatives: torch.Tensor | None = None,
    hard_excluded: torch.Tensor | None = None,
    mix: ScalarMix | None = None,
    reg_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of this rank's rows and, for self_contrastive, the regulariser's value.

    ``passages`` (B, m, d) are the rows' positives as layer vectors, ``hard_negatives`` (N, m, d);
    the rest as ``contrastive.bidirectional_infonce``."""
    all_queries = queries if all_queries is None else all_queries
    all_passages = passages if all_passages is None else all_passages
    forward = layer_scores(queries, all_passages)  # [i, c, j] = s_j(q_i, d_c)
    backward = layer_scores(all_queries, passages).transpose(0, 1)  # [i, c, j] = s_j(q_c, d_i)
    rows = torch.arange(len(queries), device=queries.device)
    targets = rows + offset
    pooled_forward, pooled_backward = pool(forward, pooling, mix), pool(backward, pooling, mix)
    if pooling == "self_contrastive":  # the positive pair scores its last layer, in both directions
        positive = forward[rows, targets]  # (B, m): s_j(q_i, d_i)
        pooled_forward = pooled_forward.index_put((rows, targets), positive[:, 0])
        pooled_backward = pooled_backward.index_put((rows, targets), positive[:, 0])
    added = []
    if hard_negatives is not None:
        added.append(scored_hard(pool(layer_scores(queries, hard_negatives), pooling, mix) / temperature,
                                 hard_excluded, offset))
    loss = scored_infonce(pooled_forward / temperature, pooled_backward / temperature, offset, false_negatives, added)
    if pooling != "self_contrastive":
        return loss, {}
    regulariser = F.cross_entropy(positive / temperature, torch.zeros_like(rows))
    return loss + reg_weight * regulariser, {"regulariser": regulariser.item()}
