"""SVDR's sparse encoder (``model_code/methods/svdr/model.py``) against independent computations: the
encoder against its formula in NumPy (one text at a time, so no padding), the top-k ∪ lexical mask
and the bag of tokens by hand, the tied projection and the separate passage side, what a saved
encoder keeps, and where its weights are looked for (SVDR, arXiv:2405.01924)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from model_code.methods.svdr import model as sparse_encoder
from model_code.methods.svdr.model import SparseEncoder, sparsify
from tests.conftest import Asked, hub_requests
from tests.helpers.svdr import START, TEXTS, hand_vectors, layer_norm, token_set


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    """The tiny model as a sparse encoder, its new LayerNorm moved off the identity so the test
    sees that it is applied."""
    model = SparseEncoder(str(tiny_model_dir))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.query.norm.weight.copy_(1 + torch.rand(32, generator=generator))
        model.query.norm.bias.copy_(torch.randn(32, generator=generator) * 0.3)
    return model


def norm_of(model):
    return model.query.norm.weight.detach().numpy(), model.query.norm.bias.detach().numpy()


def test_encoder_is_elu1p_of_the_tied_projection_max_pooled_over_real_tokens(encoder, tiny_model_dir):
    fresh = SparseEncoder(str(tiny_model_dir))
    assert torch.equal(fresh.query.norm.weight, torch.ones(32)) and torch.equal(fresh.query.norm.bias, torch.zeros(32))
    assert fresh.vocab_size == 30522 - START
    with torch.no_grad():
        vectors = encoder(encoder.tokenize(TEXTS, 16), "query").numpy()  # one padded batch
    expected = hand_vectors(tiny_model_dir, TEXTS, 16, *norm_of(encoder))
    assert vectors.shape == (3, 30522 - START)
    np.testing.assert_allclose(vectors, expected, rtol=1e-4, atol=1e-4)


def test_encode_keeps_the_top_k_or_the_texts_own_tokens(encoder, tiny_model_dir):
    tokenizer = encoder.tokenizer
    raw = hand_vectors(tiny_model_dir, TEXTS, 16, *norm_of(encoder))
    for topk, lexical in ((5, True), (5, False), (0, True), (None, True)):
        expected = np.zeros_like(raw)
        for i, (text, row) in enumerate(zip(TEXTS, raw)):
            kept = set(range(raw.shape[1])) if topk is None else set(np.argsort(-row)[:topk].tolist())
            if lexical:
                kept |= token_set(tokenizer, text, 16)
            expected[i, sorted(kept)] = row[sorted(kept)]
        encoded = encoder.encode(TEXTS, "query", 16, topk, lexical, batch_size=2)
        assert isinstance(encoded, sp.csr_matrix)
        np.testing.assert_allclose(encoded.toarray(), expected, rtol=1e-4, atol=1e-4, err_msg=f"{topk} {lexical}")


def test_bag_of_tokens_by_hand_on_a_tiny_vocabulary():
    # vocabulary of 8 ids, dimensions from id 2 (id 1 is below); id 6 is special; id 4 sits in padding positions
    ids = torch.tensor([[5, 2, 7, 7, 6], [3, 6, 1, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    bags = sparse_encoder.bag_of_tokens(ids, mask, vocab_start=2, vocab_size=6, special_ids=torch.tensor([6]))
    assert bags.tolist() == [[1, 0, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0]]


def test_sparsify_by_hand():
    v = torch.tensor([[0.5, 3.0, 1.0, 2.0], [4.0, 0.125, 0.25, 0.375]])
    lexical = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]])
    assert sparsify(v, lexical, 1).tolist() == [[0.5, 3.0, 0, 0], [4.0, 0, 0, 0.375]]
    assert sparsify(v, None, 2).tolist() == [[0, 3.0, 0, 2.0], [4.0, 0, 0, 0.375]]
    assert sparsify(v, lexical, None).tolist() == v.tolist()


def test_the_projection_is_tied_and_the_passage_side_can_be_separate(tiny_model_dir):
    model = SparseEncoder(str(tiny_model_dir), shared=False)
    assert model.passage is not model.query
    batch = model.tokenize(TEXTS, 16)
    with torch.no_grad():
        assert torch.allclose(model(batch, "query"), model(batch, "passage"))  # both start from the same weights
    model(batch, "passage").sum().backward()
    words = model.passage.backbone.get_input_embeddings().weight.grad
    assert words[START:].abs().sum() > 0 and model.passage.norm.weight.grad is not None  # E and LN train
    assert words[1:100].abs().sum() == 0  # [unused*]: neither in the text nor in the projection
    assert model.query.norm.weight.grad is None


def test_the_projection_trains_the_embedding_of_a_word_absent_from_the_text(tiny_model_dir):
    """A word w not in the text reaches its dimension V_w only through the projection, so
    ∂V_w/∂E_w = ELU1p′(x*) · LN(H_t*), with t* the token where w's logit x peaks (LayerNorm at its
    identity start): a projection that is not the embedding matrix itself (a detached or copied
    one) leaves E_w without exactly that gradient."""
    model = SparseEncoder(str(tiny_model_dir)).eval()
    batch = model.tokenize([TEXTS[0]], 16)
    word = next(i for i in range(START + 5000, 30522) if i not in set(batch["input_ids"][0].tolist()))
    model(batch, "query")[0, word - START].backward()
    embeddings = model.query.backbone.get_input_embeddings().weight
    with torch.no_grad():
        normed = layer_norm(model.query.backbone(**batch).last_hidden_state[0].double().numpy())
    x = normed @ embeddings[word].detach().double().numpy()
    peak = int(x.argmax())
    slope = 1.0 if x[peak] > 0 else np.exp(x[peak])
    np.testing.assert_allclose(embeddings.grad[word].double().numpy(), slope * normed[peak], atol=1e-5)


def test_a_saved_encoder_loads_with_its_layernorms_and_passage_side(tiny_model_dir, tmp_path):
    encoder = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        encoder.query.norm.bias.fill_(0.5)
        encoder.passage.norm.weight.fill_(2.0)
        encoder.passage.backbone.get_input_embeddings().weight[START:].mul_(3.0)
    encoder.save(tmp_path / "saved")
    loaded = SparseEncoder(str(tmp_path / "saved"), shared=False)
    batch = encoder.tokenize(TEXTS, 16)
    with torch.no_grad():
        for side in ("query", "passage"):
            assert torch.allclose(loaded(batch, side), encoder(batch, side)), side


def test_one_model_encodes_both_sides_by_default(tiny_model_dir):
    """shared (the default here) means one model and one LayerNorm for queries and passages."""
    encoder = SparseEncoder(str(tiny_model_dir))
    assert encoder.passage is encoder.query and encoder.vocab_start == START


def test_a_saved_shared_encoder_is_one_model_again_with_its_layernorm(tiny_model_dir, tmp_path):
    encoder = SparseEncoder(str(tiny_model_dir))
    with torch.no_grad():
        encoder.query.norm.bias.fill_(0.5)
        encoder.query.norm.weight.fill_(1.5)
    encoder.save(tmp_path / "saved")
    assert not (tmp_path / "saved" / "passage").exists()  # one model: no passage side written
    assert set(torch.load(tmp_path / "saved" / "svdr_norms.pt")) == {"query"}
    loaded = SparseEncoder(str(tmp_path / "saved"))
    assert loaded.passage is loaded.query
    assert torch.equal(loaded.query.norm.bias, torch.full((32,), 0.5))
    assert torch.equal(loaded.query.norm.weight, torch.full((32,), 1.5))


def test_encode_cuts_texts_at_max_length_tokens(tiny_model_dir):
    """A text past max_length (and past the tiny model's 128 positions) is encoded as its first
    max_length tokens: the formula in NumPy on the cut text."""
    encoder = SparseEncoder(str(tiny_model_dir))
    long = "stars planets galaxies telescope orbit comet nebula " * 30
    encoded = encoder.encode([long, "a recipe"], "query", 8, None, lexical=False).toarray()
    weight, bias = encoder.query.norm.weight.detach().numpy(), encoder.query.norm.bias.detach().numpy()
    np.testing.assert_allclose(encoded, hand_vectors(tiny_model_dir, [long, "a recipe"], 8, weight, bias),
                               rtol=1e-4, atol=1e-4)


def test_encode_of_no_texts_and_the_training_mode_it_leaves(tiny_model_dir):
    encoder = SparseEncoder(str(tiny_model_dir))
    empty = encoder.encode([], "passage", 8, 5, lexical=True)
    assert empty.shape == (0, 30522 - START) and empty.dtype == np.float32 and isinstance(empty, sp.csr_matrix)
    for training in (True, False):
        encoder.train(training)
        encoder.encode(["a recipe"], "query", 8, 5, lexical=True)
        assert encoder.training is training and encoder.query.backbone.training is training


def test_a_vocab_start_must_leave_a_dimension(tiny_model_dir):
    assert SparseEncoder(str(tiny_model_dir), vocab_start=30521).vocab_size == 1
    for start in (30522, 30600):  # the vocabulary has 30522 tokens however far past it vocab_start lies
        with pytest.raises(ValueError, match=f"vocab_start {start} leaves no dimension of a 30522-token vocabulary"):
            SparseEncoder(str(tiny_model_dir), vocab_start=start)


@pytest.mark.parametrize("offline, directory, local_only", [("1", False, True), ("0", False, False),
                                                            (None, False, False), ("0", True, True)])
def test_the_hub_is_asked_only_online_and_only_for_a_name_that_is_no_directory(tmp_path, monkeypatch, offline,
                                                                                directory, local_only):
    """HF_HUB_OFFLINE=1 or a local directory: neither the tokenizer nor the model may be downloaded
    (local_files_only)."""
    name = str(tmp_path) if directory else "some-org/some-model"
    assert hub_requests(monkeypatch, sparse_encoder, SparseEncoder, name, offline) == [(name, local_only)] * 2


def test_a_separate_passage_side_is_not_downloaded_either(monkeypatch):
    asked = []

    def from_pretrained(path, local_files_only):
        asked.append((path, local_files_only))
        if len(asked) == 3:  # the tokenizer, the query side, then the passage side
            raise Asked
        return SimpleNamespace(config=SimpleNamespace(hidden_size=4))

    monkeypatch.setattr(sparse_encoder, "AutoTokenizer", SimpleNamespace(from_pretrained=from_pretrained))
    monkeypatch.setattr(sparse_encoder, "AutoModel", SimpleNamespace(from_pretrained=from_pretrained))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(Asked):
        SparseEncoder("some-org/some-model", shared=False)
    assert asked == [("some-org/some-model", True)] * 3


def test_the_default_side_is_the_query_side(tiny_model_dir):
    encoder = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        encoder.passage.norm.bias.fill_(0.5)
        batch = encoder.tokenize(["a recipe", "stars and planets"], 8)
        assert torch.equal(encoder(batch), encoder(batch, "query"))
        assert not torch.allclose(encoder(batch), encoder(batch, "passage"))
