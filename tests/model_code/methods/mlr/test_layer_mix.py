"""MLR's scalar mix file (``model_code/methods/mlr/layer_mix.py``) against its documented contents: the
softmax of the saved logits for the layers it mixes, and clear errors for other layers or no file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from model_code.methods.mlr.layer_mix import ScalarMix, load_weights


def test_scalar_mix_weights_are_saved_and_read_back_for_their_layers(tmp_path):
    mix = ScalarMix([6, 4, 2])
    with torch.no_grad():
        mix.logits.copy_(torch.tensor([0.0, 1.0, 2.0]))
    mix.save(tmp_path)
    by_hand = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    weights = load_weights(tmp_path, [6, 4, 2])
    assert weights.dtype == np.float32
    np.testing.assert_allclose(weights, by_hand, rtol=1e-6)
    assert json.loads((tmp_path / "scalar_mix.json").read_text())["layers"] == [6, 4, 2]


def test_scalar_mix_weights_for_other_layers_or_none_at_all_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"scalar_mix\.json: no scalar-mix weights beside the encoder; run the "
                                                r"train stage with retriever\.mlr\.pooling scalar_mix"):
        load_weights(tmp_path, [6, 4])
    ScalarMix([6, 4]).save(tmp_path)
    with pytest.raises(ValueError, match=r"scalar_mix\.json mixes layers \[6, 4\], but retriever\.mlr\.layers is "
                                         r"\[6, 5\]: run the train stage again"):
        load_weights(tmp_path, (6, 5))
