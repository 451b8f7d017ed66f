"""HCE's training objective: the HCE loss (``loss.py``) per stream; sampled negatives come from
embeddings cached at the last (re-)clustering (no gradient, cheap) or are encoded afresh. A stream
marked not ``hierarchical`` keeps the plain in-batch loss (e.g. HCE-J with the tree's terms on the
supervised stream only, ICT trained as in "+CT").
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch

from model_code.methods.hce.loss import HCELoss
from model_code.models.encoder import Encoder
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import ContrastiveObjective, EncodedBatch, Stream
from model_code.training.pairs import false_negatives


class HCEObjective(ContrastiveObjective):
    """``ContrastiveObjective`` whose ``hierarchical`` streams get the HCE loss instead."""

    def __init__(self, encoder: Encoder, loss: HCELoss, streams: list[Stream], doc_ids: list[str],
                 passages: list[str], cache: torch.Tensor, encode_negatives: bool, query_length: int,
                 passage_length: int, generator: torch.Generator, forward: Callable | None = None,
                 hard_negatives: HardNegatives | None = None, query_forward: Callable | None = None):
        row = {d: i for i, d in enumerate(doc_ids)}
        super().__init__(encoder, streams, lambda d: passages[row[d]], loss.temperature, query_length,
                         passage_length, forward, hard_negatives, query_forward)
        self.loss, self.row = loss, row
        self.passages, self.cache, self.encode_negatives = passages, cache, encode_negatives
        self.generator = generator  # shared across EM rounds: each round draws new negatives

    def _negatives(self, index: torch.Tensor) -> torch.Tensor:
        if not self.encode_negatives or index.numel() == 0:
            return self.cache[index].to(self.encoder.device)
        flat = index.reshape(-1).tolist()
        vectors = self.forward(self.encoder.tokenize([self.passages[i] for i in flat], self.passage_length))
        return vectors.reshape(*index.shape, -1)

    def stream_loss(self, stream: Stream, batch: pd.DataFrame, enc: EncodedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The HCE loss of one stream's batch: centroid levels and nearby sampled negatives."""
        if not stream.hierarchical:
            return super().stream_loss(stream, batch, enc)
        doc_index = torch.tensor([self.row[d] for d in batch["doc_id"]])
        positives = [{self.row[d] for d in relevant} for relevant in batch["positives"]]
        negatives, mask = self.loss.sample_negatives(doc_index, self.generator, positives)  # global batch
        rows = enc.rows
        loss, level_parts = self.loss(
            enc.queries, enc.passages, doc_index[rows], self._negatives(negatives[rows]), mask[rows],
            enc.all_queries, enc.all_passages, enc.offset, false_negatives(batch), enc.hard, enc.hard_excluded,
        )
        return loss, {f"{stream.name}.{k}": v for k, v in level_parts.items()}
