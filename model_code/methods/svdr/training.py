"""SVDR training: the semi-parametric loss (``methods/svdr/loss.py``) as a training objective.

It is ``ContrastiveObjective`` with the sparse encoder: the same streams of (query, positive)
pairs (train qrels and/or ICT pseudo-queries, ``train.data``), the same slicing of the global
batch over torchrun ranks and gathering with gradients, the same mined hard negatives
(``train.hard_negatives``). A text's encoding is its pooled vocabulary vector and its binary bag of
tokens side by side in one tensor, so the base class gathers both and encodes hard negatives the
same way; ``stream_loss`` splits them again. Temperature is 1, as in SVDR.

With ``retrieved`` (``retriever.svdr.retrieved_negatives``), each step also retrieves negatives for
the global batch's queries from the corpus's binary token index with their just-encoded vectors
(SVDR's in-training negative retrieval) and adds them after any mined ones.

``SVDRRecipe`` is the kind's training recipe: the sparse encoder (its sides untied by
``retriever.svdr.shared_encoder``, not ``encoder.shared_encoder``), this objective under
``train.method: contrastive`` only, saved with its LayerNorms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pandas as pd
import scipy.sparse as sp
import torch

from model_code.methods.svdr.loss import svdr_loss
from model_code.methods.svdr.model import SparseEncoder, sparsify
from model_code.methods.svdr.token_bags import bag_of_tokens
from model_code.stores import exact_store
from model_code.training.distributed import gather_with_grad
from model_code.training.negatives import HardNegatives, RetrievedNegatives
from model_code.training.objectives import ContrastiveObjective, EncodedBatch, Stream
from model_code.training.pairs import false_negatives
from model_code.training.recipe import ObjectiveInputs, TrainingRecipe

if TYPE_CHECKING:
    from model_code.methods.svdr.retriever import SVDRSettings
    from model_code.training.loop import Trainer


class SVDRObjective(ContrastiveObjective):
    def __init__(self, encoder: SparseEncoder, streams: list[Stream], passage_text: Callable[[str], str],
                 query_length: int, passage_length: int, topk: int | None, variant: Literal["svdr", "vdr"],
                 hard_negatives: HardNegatives | None = None, retrieved: RetrievedNegatives | None = None):
        super().__init__(encoder, streams, passage_text, 1.0, query_length, passage_length,
                         forward=lambda batch: self.vector_and_tokens(batch, "query"), hard_negatives=hard_negatives)
        self.topk, self.variant, self.retrieved = topk, variant, retrieved

    def vector_and_tokens(self, batch: dict[str, torch.Tensor], side: str) -> torch.Tensor:
        """(B, 2V): the pooled vector (with gradients), then the bag of tokens."""
        return torch.cat([self.encoder(batch, side), self.encoder.lexical(batch)], dim=1)

    def encode_passages(self, doc_ids: list[str]) -> torch.Tensor:
        batch = self.encoder.tokenize([self.passage_text(d) for d in doc_ids], self.passage_length)
        return self.vector_and_tokens(batch, "passage")

    def encode(self, batch: pd.DataFrame) -> EncodedBatch:
        """The base class's encoding, then the retrieved negatives: the global batch's query vectors
        as beta search sends them (E(q)_k, without gradients) pick each row's draws, this rank
        encodes its rows' draws, and the gathered block follows the mined negatives."""
        enc = super().encode(batch)
        if self.retrieved is None:
            return enc
        size, k, encoded = self.encoder.vocab_size, self.retrieved.count, enc.all_queries.detach()
        queries = sparsify(encoded[:, :size], encoded[:, size:], self.topk)
        ids, excluded = self.retrieved.draw(batch, sp.csr_matrix(queries.float().cpu().numpy()))
        found = gather_with_grad(self.encode_passages(ids[enc.rows.start * k : enc.rows.stop * k]))
        if enc.hard is None:
            enc.hard, enc.hard_excluded = found, excluded
        else:
            enc.hard, enc.hard_excluded = torch.cat([enc.hard, found]), torch.cat([enc.hard_excluded, excluded], dim=1)
        return enc

    def stream_loss(self, stream: Stream, batch: pd.DataFrame, enc: EncodedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        size = self.encoder.vocab_size
        passages, excluded = enc.all_passages, false_negatives(batch)
        if enc.hard is not None:
            passages, excluded = torch.cat([passages, enc.hard]), torch.cat([excluded, enc.hard_excluded], dim=1)
        loss, terms = svdr_loss(enc.all_queries[:, :size], passages[:, :size], enc.all_queries[:, size:],
                                passages[:, size:], self.topk, self.variant, enc.rows, excluded.to(passages.device))
        return loss, {stream.name: loss.item(), **{f"{stream.name}.{k}": v for k, v in terms.items()}}


def retrieved_negatives(svdr: SVDRSettings, encoder: SparseEncoder, passages: dict[str, str], passage_length: int,
                        seed: int) -> RetrievedNegatives | None:
    """In-training negative retrieval over the corpus's binary token index, cut at the training
    passage length as the loss's bags of tokens are (None when ``retrieved_negatives`` is 0)."""
    if not svdr.retrieved_negatives:
        return None
    matrix = bag_of_tokens(encoder.tokenizer, list(passages.values()), passage_length, svdr.vocab_start,
                           encoder.vocab_size, desc="binary index for negatives")
    # a stream of its own: seeded as the mined draws, it would pick the same positions in its pools
    return RetrievedNegatives(exact_store(matrix, list(passages), "sparse"), svdr.retrieved_negatives,
                              svdr.retrieval_depth, seed + 1)


class SVDRRecipe(TrainingRecipe):
    methods = ("contrastive",)

    def build_encoder(self) -> SparseEncoder:
        self.svdr = self.settings.retriever.settings("svdr")
        if not self.settings.encoder.shared_encoder:
            raise ValueError("encoder.shared_encoder is for the dense encoder kinds; retriever.kind svdr unties its "
                             "sides with retriever.svdr.shared_encoder")
        return SparseEncoder(self.settings.encoder.model, self.svdr.vocab_start, self.svdr.shared_encoder)

    def objective(self, inputs: ObjectiveInputs, trainer: Trainer) -> SVDRObjective:
        return SVDRObjective(self.encoder, inputs.streams, inputs.passages.__getitem__, inputs.query_length,
                             inputs.passage_length, self.svdr.topk, self.svdr.loss, hard_negatives=inputs.hard_negatives,
                             retrieved=retrieved_negatives(self.svdr, self.encoder, inputs.passages,
                                                           inputs.passage_length, inputs.seed))

    def save(self, directory: Path) -> None:
        self.encoder.save(directory)
