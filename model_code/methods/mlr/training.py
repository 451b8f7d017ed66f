"""MLR's training recipe: the contrastive loss with documents as their multi-layer
representations (``MLRObjective``, ``retriever.mlr.pooling``); a scalar mix's weights train at
``retriever.mlr.mix_learning_rate`` and are saved beside the encoder (uniform when nothing trained
them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from model_code.methods.mlr.layer_mix import ScalarMix
from model_code.methods.mlr.objective import MLRObjective
from model_code.methods.mlr.retriever import check_layers
from model_code.training.recipe import ObjectiveInputs, TrainingRecipe

if TYPE_CHECKING:
    from model_code.config import Params
    from model_code.training.loop import Trainer


class MLRRecipe(TrainingRecipe):
    def __init__(self, settings: Params):
        super().__init__(settings)
        self.mlr = settings.retriever.settings("mlr")
        check_layers(self.mlr, self.encoder.num_layers)
        self.mix = ScalarMix(self.mlr.layers).to(self.encoder.device) if self.mlr.pooling == "scalar_mix" else None

    def objective(self, inputs: ObjectiveInputs, trainer: Trainer) -> MLRObjective:
        if self.mix is not None:
            trainer.add_parameters(self.mix.parameters(), self.mlr.mix_learning_rate)
        return MLRObjective(self.encoder, inputs.streams, inputs.passages.__getitem__, inputs.temperature,
                            inputs.query_length, inputs.passage_length, self.mlr.layers, self.mlr.pooling,
                            self.mlr.reg_weight, self.mix, hard_negatives=inputs.hard_negatives,
                            query_forward=self.query_forward)

    def modules(self) -> list[torch.nn.Module]:
        return [self.encoder] if self.mix is None else [self.encoder, self.mix]

    def save(self, directory: Path) -> None:
        super().save(directory)
        if self.mix is not None:
            self.mix.save(directory)

    def summary(self) -> dict[str, Any]:
        return {} if self.mix is None else {"scalar_mix_weights": self.mix.weights().tolist()}
