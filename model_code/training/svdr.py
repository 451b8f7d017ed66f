"""SVDR training: the semi-parametric loss (``losses/svdr.py``) as a training objective.

It is ``ContrastiveObjective`` with the sparse encoder: the same streams of (query, positive)
pairs (train qrels and/or ICT pseudo-queries, ``train.data``), the same slicing of the global
batch over torchrun ranks and gathering with gradients, the same mined hard negatives
(``train.hard_negatives``). A text's encoding is its pooled vocabulary vector and its binary bag of
tokens side by side in one tensor, so the base class gathers both and encodes hard negatives the
same way; ``stream_loss`` splits them again. Temperature is 1, as in SVDR.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import pandas as pd
import torch

from model_code.losses.svdr import svdr_loss
from model_code.models.sparse_encoder import SparseEncoder
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import ContrastiveObjective, EncodedBatch, Stream
from model_code.training.pairs import false_negatives


class SVDRObjective(ContrastiveObjective):
    def __init__(self, encoder: SparseEncoder, streams: list[Stream], passage_text: Callable[[str], str],
                 query_length: int, passage_length: int, topk: int | None, variant: Literal["svdr", "vdr"],
                 hard_negatives: HardNegatives | None = None):
        super().__init__(encoder, streams, passage_text, 1.0, query_length, passage_length,
                         forward=lambda batch: self.vector_and_tokens(batch, "query"), hard_negatives=hard_negatives)
        self.topk, self.variant = topk, variant

    def vector_and_tokens(self, batch: dict[str, torch.Tensor], side: str) -> torch.Tensor:
        """(B, 2V): the pooled vector (with gradients), then the bag of tokens."""
        return torch.cat([self.encoder(batch, side), self.encoder.lexical(batch)], dim=1)

    def encode_passages(self, doc_ids: list[str]) -> torch.Tensor:
        batch = self.encoder.tokenize([self.passage_text(d) for d in doc_ids], self.passage_length)
        return self.vector_and_tokens(batch, "passage")

    def stream_loss(self, stream: Stream, batch: pd.DataFrame, enc: EncodedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        size = self.encoder.vocab_size
        passages, excluded = enc.all_passages, false_negatives(batch)
        if enc.hard is not None:
            passages, excluded = torch.cat([passages, enc.hard]), torch.cat([excluded, enc.hard_excluded], dim=1)
        loss, terms = svdr_loss(enc.all_queries[:, :size], passages[:, :size], enc.all_queries[:, size:],
                                passages[:, size:], self.topk, self.variant, enc.rows, excluded.to(passages.device))
        return loss, {stream.name: loss.item(), **{f"{stream.name}.{k}": v for k, v in terms.items()}}
