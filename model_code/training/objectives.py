"""Training objectives: draw a batch from each data stream, encode it, return the weighted loss.

* ``ContrastiveObjective``: bidirectional in-batch loss per stream (the skeleton's training and
  the HCE paper's "+CT" baseline).
* ``HCEObjective``: the HCE loss (``losses/hierarchical.py``) per stream; sampled negatives come
  from embeddings cached at the last (re-)clustering (no gradient, cheap) or are encoded afresh.
  A stream marked not ``hierarchical`` keeps the plain in-batch loss (e.g. HCE-J with the tree's
  terms on the supervised stream only, ICT trained as in "+CT").
* ``MLRObjective``: documents as their vectors at several layers, scored by MLR's pooling
  (``losses/multi_layer.py``): multi, mean, scalar mix or self-contrastive.

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
from model_code.losses.hierarchical import HCELoss
from model_code.losses.multi_layer import mlr_infonce
from model_code.models.encoder import Encoder
from model_code.models.layer_mix import ScalarMix
from model_code.training.distributed import gather_with_grad, local_slice
from model_code.training.negatives import HardNegatives
from model_code.training.pairs import false_negatives


@dataclass
class Stream:
    name: str
    batches: Iterator[pd.DataFrame]
    weight: float
    hierarchical: bool = True  # HCEObjective: HCE loss (True) or the plain in-batch loss


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
