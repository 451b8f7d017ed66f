"""MLR's training objective: documents as their vectors at several layers, scored by MLR's pooling
(``loss.py``): multi, mean, scalar mix or self-contrastive.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch

from model_code.methods.mlr.layer_mix import ScalarMix
from model_code.methods.mlr.loss import mlr_infonce
from model_code.models.encoder import Encoder
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import ContrastiveObjective, EncodedBatch, Stream
from model_code.training.pairs import false_negatives


class MLRObjective(ContrastiveObjective):
    """``ContrastiveObjective`` with documents (positives and hard negatives) as their pooled vectors
    at ``layers`` (last layer first) and MLR's ``pooling``; queries stay last-layer vectors.
    ``mix`` holds the trainable scalar-mix weights (pooling scalar_mix); ``reg_weight`` is the
    self-contrastive regulariser's lambda."""

    def __init__(self, encoder: Encoder, streams: list[Stream], passage_text: Callable[[str], str],
                 temperature: float, query_length: int, passage_length: int, layers: list[int], pooling: str,
                 reg_weight: float = 0.0, mix: ScalarMix | None = None, hard_negatives: HardNegatives | None = None,
                 query_forward: Callable | None = None):
        super().__init__(encoder, streams, passage_text, temperature, query_length, passage_length,
                         hard_negatives=hard_negatives, query_forward=query_forward)
        self.layers, self.pooling, self.reg_weight, self.mix = layers, pooling, reg_weight, mix

    def encode_passages(self, doc_ids: list[str]) -> torch.Tensor:
        batch = self.encoder.tokenize([self.passage_text(d) for d in doc_ids], self.passage_length)
        return self.encoder.layer_vectors(batch, self.layers)

    def stream_loss(self, stream: Stream, batch: pd.DataFrame, enc: EncodedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        loss, parts = mlr_infonce(enc.queries, enc.passages, self.temperature, self.pooling, enc.all_queries,
                                  enc.all_passages, enc.offset, false_negatives(batch), enc.hard, enc.hard_excluded,
                                  self.mix, self.reg_weight)
        return loss, {stream.name: loss.item(), **{f"{stream.name}.{k}": v for k, v in parts.items()}}
