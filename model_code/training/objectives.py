"""Training objectives: draw a batch from each data stream, encode it, return the weighted loss.

* ``ContrastiveObjective``: bidirectional in-batch loss per stream (the skeleton's training and
  the HCE paper's "+CT" baseline).

A method with a loss of its own subclasses it in its package (``model_code/methods/<name>/``:
HCE's ``HCEObjective``, MLR's ``MLRObjective``, SVDR's ``SVDRObjective``), overriding
``stream_loss`` (and ``encode_passages`` where its documents are encoded otherwise).

Queries are encoded by ``query_forward`` (default: ``forward``, the encoder itself), so an untied
encoder's query side (``Encoder(..., side="query")``) encodes them and its passage side the rest.

Streams are (name, batch iterator, weight): HCE-J is supervised (weight 1) + ICT (weight alpha).
Under torchrun every rank draws the same global batch and encodes only its slice. With mined hard
negatives (``training/negatives.py``) each rank also encodes its rows' draws, gathered so that
every query of the global batch scores all of them, in either objective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import torch

from model_code.losses.contrastive import bidirectional_infonce
from model_code.models.encoder import Encoder
from model_code.training.distributed import gather_with_grad, local_slice
from model_code.training.negatives import HardNegatives
from model_code.training.pairs import false_negatives


@dataclass
class Stream:
    name: str
    batches: Iterator[pd.DataFrame]
    weight: float
    hierarchical: bool = True  # HCE's objective: HCE loss (True) or the plain in-batch loss


@dataclass
class EncodedBatch:
    queries: torch.Tensor  # this rank's rows
    passages: torch.Tensor
    all_queries: torch.Tensor  # the global batch (gathered, with gradients)
    all_passages: torch.Tensor
    offset: int
    rows: slice
    hard: torch.Tensor | None = None  # the global batch's hard negatives (gathered), k per row
    hard_excluded: torch.Tensor | None = None  # (B_global, B_global * k): not a negative of that query


class ContrastiveObjective:
    def __init__(self, encoder: Encoder, streams: list[Stream], passage_text: Callable[[str], str],
                 temperature: float, query_length: int, passage_length: int, forward: Callable | None = None,
                 hard_negatives: HardNegatives | None = None, query_forward: Callable | None = None):
        self.encoder, self.forward = encoder, forward or encoder
        self.query_forward = query_forward or self.forward  # an untied encoder's query side
        self.streams, self.passage_text, self.temperature = streams, passage_text, temperature
        self.query_length, self.passage_length = query_length, passage_length
        self.hard_negatives = hard_negatives

    def encode_passages(self, doc_ids: list[str]) -> torch.Tensor:
        return self.forward(self.encoder.tokenize([self.passage_text(d) for d in doc_ids], self.passage_length))

    def encode(self, batch: pd.DataFrame) -> EncodedBatch:
        """This rank's rows of ``batch`` encoded, the global batch gathered, and the hard negatives
        drawn for it (none when no row's query has a pool, e.g. a batch of pseudo-queries)."""
        rows = local_slice(len(batch))
        local = batch.iloc[rows]
        queries = self.query_forward(self.encoder.tokenize(local["query"].tolist(), self.query_length))
        passages = self.encode_passages(local["doc_id"].tolist())
        enc = EncodedBatch(queries, passages, gather_with_grad(queries), gather_with_grad(passages), rows.start, rows)
        if self.hard_negatives is not None:
            ids, excluded = self.hard_negatives.draw(batch)
            if not excluded.all():
                k = self.hard_negatives.count
                enc.hard = gather_with_grad(self.encode_passages(ids[rows.start * k : rows.stop * k]))
                enc.hard_excluded = excluded
        return enc

    def stream_loss(self, stream: Stream, batch: pd.DataFrame, enc: EncodedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The bidirectional in-batch loss of one stream's batch (no tree, no sampled negatives)."""
        loss = bidirectional_infonce(enc.queries, enc.passages, self.temperature, enc.all_queries,
                                     enc.all_passages, enc.offset, false_negatives=false_negatives(batch),
                                     hard_negatives=enc.hard, hard_excluded=enc.hard_excluded)
        return loss, {stream.name: loss.item()}

    def __call__(self) -> tuple[torch.Tensor, dict[str, float]]:
        total, parts = 0.0, {}
        for stream in self.streams:
            batch = next(stream.batches)
            loss, stream_parts = self.stream_loss(stream, batch, self.encode(batch))
            parts.update(stream_parts)
            total = total + stream.weight * loss
        return total, parts
