"""MLR's scalar mix pooling: one document vector as a learned convex combination of its layer
vectors, d = sum_j softmax(s)_j h_j, with s initialised to zeros, i.e. uniform weights, so training
starts from average pooling (MLR §3.2; the reference code has no ELMo-style gamma scale, nor
does this). One weight vector for the whole corpus, trained with the encoder by the train stage
and saved beside it (``scalar_mix.json``); the index stage copies the weights into the retriever's
manifest, so every later version and the served model pool exactly as the index was built.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

FILE = "scalar_mix.json"


class ScalarMix(torch.nn.Module):
    def __init__(self, layers: list[int]):
        super().__init__()
        self.layers = list(layers)
        self.logits = torch.nn.Parameter(torch.zeros(len(layers)))

    def weights(self) -> torch.Tensor:
        return torch.softmax(self.logits, dim=0)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        """Scores (..., m) of a query against each layer vector of a document -> its score against
        the mixed vector (the inner product is linear: mixing the scores is scoring the mix)."""
        return scores @ self.weights().to(scores.dtype)

    def save(self, directory: Path) -> None:
        (Path(directory) / FILE).write_text(json.dumps(
            {"layers": self.layers, "weights": self.weights().tolist()}, indent=2) + "\n")


def load_weights(directory: Path, layers: list[int]) -> np.ndarray:
    """The weights the train stage saved in the encoder ``directory`` for these ``layers``."""
    path = Path(directory) / FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no scalar-mix weights beside the encoder; run the train stage with "
                                "retriever.mlr.pooling scalar_mix")
    saved = json.loads(path.read_text())
    if saved["layers"] != list(layers):
        raise ValueError(f"{path} mixes layers {saved['layers']}, but retriever.mlr.layers is {list(layers)}: "
                         "run the train stage again")
    return np.asarray(saved["weights"], dtype=np.float32)
