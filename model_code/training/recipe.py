"""How a retriever kind's encoder trains: the model the train stage fine-tunes, the contrastive
objective it trains with, the ``train.method`` values it accepts and what it saves.

A kind names its recipe (``Retriever.training_recipe``); the train stage asks the kind for it and
runs whichever method ``train.method`` names, so it never names a kind, and a kind with an
objective of its own (MLR's multi-layer documents, SVDR's sparse semi-parametric loss) is its
recipe plus the kind, wherever both are defined. ``TrainingRecipe`` is the dense encoder every
other neural kind trains: the bidirectional in-batch contrastive loss, or HCE's. A ``train.method``
that trains its own way rather than through ``objective`` (HCE's EM rounds against the corpus tree)
is its method package's ``training.train``, listed in ``own_training``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from model_code.methods.hce import training as hce
from model_code.models.encoder import Encoder
from model_code.training.objectives import ContrastiveObjective, Stream

if TYPE_CHECKING:
    from model_code.config import EncoderParams, Params
    from model_code.training.loop import Trainer
    from model_code.training.negatives import HardNegatives


@dataclass
class ObjectiveInputs:
    """What every contrastive objective is made of: the training streams, each document's text,
    the lengths and temperature of ``train``/``encoder``, the mined negatives, the corpus and the seed."""

    streams: list[Stream]
    passages: dict[str, str]
    temperature: float
    query_length: int
    passage_length: int
    hard_negatives: HardNegatives | None
    seed: int


def dense_encoder(params: EncoderParams) -> Encoder:
    """``encoder.model`` with the tying ``encoder.shared_encoder`` asks for: untied, the query side
    starts as a copy of the model, or as the query side of a model saved untied; a model saved
    untied is refused for tied training rather than silently trained untied."""
    encoder = Encoder(params.model, params.pooling, untie=not params.shared_encoder)
    if encoder.shared != params.shared_encoder:
        raise ValueError(f"encoder.model {params.model} holds a separate query encoder (query/): set "
                         "encoder.shared_encoder to false to train it further")
    return encoder


class TrainingRecipe:
    """The dense encoder, trained by the contrastive loss or by HCE."""

    methods: ClassVar[tuple[str, ...]] = ("contrastive", "hce")
    # methods trained their own way: (settings, layout, encoder, corpus tree or None, data, pseudo-queries,
    # hard negatives, step callback) -> (summary, final tree)
    own_training: ClassVar[dict[str, Callable]] = {"hce": hce.train}

    def __init__(self, settings: Params):
        self.settings = settings
        self.encoder = self.build_encoder()

    def build_encoder(self) -> torch.nn.Module:
        return dense_encoder(self.settings.encoder)

    def objective(self, inputs: ObjectiveInputs, trainer: Trainer) -> ContrastiveObjective:
        """The contrastive objective (``train.method: contrastive``); it may add parameters to ``trainer``."""
        return ContrastiveObjective(self.encoder, inputs.streams, inputs.passages.__getitem__, inputs.temperature,
                                    inputs.query_length, inputs.passage_length, hard_negatives=inputs.hard_negatives,
                                    query_forward=self.query_forward)

    @property
    def query_forward(self) -> Callable:
        return functools.partial(self.encoder, side="query")  # the query side (a tied encoder's only one)

    def modules(self) -> list[torch.nn.Module]:
        """What is trained, as dev selection keeps its best state."""
        return [self.encoder]

    def save(self, directory: Path) -> None:
        """The stage's output (and each dev score's retriever reads it)."""
        self.encoder.save(directory, self.settings.encoder.max_passage_length)

    def summary(self) -> dict[str, Any]:
        """What the train report adds for this recipe."""
        return {}
