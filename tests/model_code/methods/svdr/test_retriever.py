"""SVDR's method core against independent computations, for what the mutation run
(``tests/mutation``) found untested in ``tests/test_svdr.py``: the index's order among equal
scores and its vocabulary bounds checked by brute force, ``build`` and ``add`` with stand-ins and a
scripted clock, what a saved retriever keeps, and the encoder's defaults (SVDR, arXiv:2405.01924;
the reference's facts in the design notes, §3)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from transformers import AutoTokenizer

from model_code.config import IndexParams
from model_code.data.ingested import passage_texts
from model_code.methods.svdr import model as sparse_encoder
from model_code.methods.svdr import retriever as svdr
from model_code.methods.svdr import token_bags
from model_code.methods.svdr.model import SparseEncoder
from model_code.methods.svdr.retriever import SVDRRetriever, SVDRSettings
from model_code.methods.svdr.token_bags import bag_of_tokens
from model_code.methods.svdr.training import SVDRObjective
from model_code.retrievers import load_retriever, save_retriever
from model_code.retrievers.base import UpdateContext
from model_code.stores.csr_store import CsrStore
from model_code.training import objectives
from model_code.training.objectives import Stream
from tests.conftest import Asked, hub_requests, recording_loader
from tests.test_svdr import CORPUS, LENGTHS, START, binary, ell, hand_vectors, sparsified, token_set


class ScriptedClock:
    """time.perf_counter for the svdr module: each call returns the next of the given instants."""

    def __init__(self, *instants: float):
        self.instants = list(instants)

    def perf_counter(self) -> float:
        return self.instants.pop(0)


# -- the index -----------------------------------------------------------------------------------
def test_equal_scores_rank_by_row_and_removed_rows_never_rank():
    """A binary index scores a query of ones by each row's token count: hundreds of ties, which
    the index orders by row (its documented tie rule), brute force over the live rows."""
    rng = np.random.default_rng(3)
    bags = (rng.random((300, 6)) < 0.4).astype(np.float32)
    index = CsrStore.build(sp.csr_matrix(bags), [f"d{i}" for i in range(300)])
    index.remove([f"d{i}" for i in range(0, 300, 7)])
    queries = np.array([[1.0] * 6, [1.0, 1.0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 2.0]], dtype=np.float32)
    scores, rows = index.search_rows(sp.csr_matrix(queries), 120)
    live = [r for r in range(300) if r % 7]
    for q, s, r in zip(queries, scores, rows):
        by_hand = {row: float(q @ bags[row]) for row in live}
        assert len(set(by_hand.values())) < 8  # ties everywhere
        assert r.tolist() == sorted(live, key=lambda row: (-by_hand[row], row))[:120]
        assert s.tolist() == [by_hand[row] for row in r]


def test_a_search_over_more_queries_than_one_chunk_is_the_same():
    rng = np.random.default_rng(4)
    matrix = sp.csr_matrix(rng.random((20, 4)).astype(np.float32))
    queries = rng.random((11, 4)).astype(np.float32)  # more queries than dimensions
    index = CsrStore.build(matrix, [f"d{i}" for i in range(20)])
    scores, rows = index.search_rows(sp.csr_matrix(queries), 5, chunk=3)  # chunks of 3, 3, 3 and 2 queries
    dense = queries @ matrix.toarray().T
    assert rows.tolist() == [sorted(range(20), key=lambda j: (-d[j], j))[:5] for d in dense]
    np.testing.assert_allclose(scores, np.take_along_axis(dense, rows, axis=1), rtol=1e-6)


def test_an_index_saves_into_a_new_nested_folder_and_over_an_earlier_save(tmp_path):
    index = CsrStore.build(sp.csr_matrix(np.eye(3, dtype=np.float32)), ["a", "b", "c"])
    index.save(tmp_path / "new" / "nested")  # parents created
    index.remove(["b"])
    index.save(tmp_path / "new" / "nested")  # the folder exists: overwritten
    loaded = CsrStore.load_files(tmp_path / "new" / "nested")
    assert loaded.live_ids() == ["a", "c"] and loaded.live.dtype == bool and (loaded.matrix != index.matrix).nnz == 0


def test_a_clash_or_a_missing_id_is_named_changes_nothing_and_lists_at_most_five_ids():
    ids = [f"d{i}" for i in range(8)]
    index = CsrStore.build(sp.csr_matrix(np.eye(8, dtype=np.float32)), ids)
    with pytest.raises(ValueError, match=r"^documents already indexed: \['d1', 'd2', 'd3', 'd4', 'd5'\]$"):
        index.add(sp.csr_matrix(np.eye(8, dtype=np.float32)[:7]), ["new", *reversed(ids[1:7])])
    with pytest.raises(KeyError, match=r"documents not in the index: \['x1', 'x2', 'x3', 'x4', 'x5'\]"):
        index.remove(["d0", *[f"x{i}" for i in range(7, 0, -1)]])
    assert index.live_ids() == ids and index.matrix.shape == (8, 8)  # neither call changed the index
    assert index.remove(["d0"]) == 1 and index.live_ids() == ids[1:]


class RecordingBackend:
    """A Rust tokenizer, recording the texts each batch encoding is given."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def encode_batch_fast(self, texts):
        self.calls.append(list(texts))
        return self.backend.encode_batch_fast(texts)


def recorded_calls(monkeypatch) -> list:
    """The texts of every batch encoding ``bag_of_tokens`` makes from now on, call by call."""
    recorders, real = [], token_bags.truncating_backend

    def recording(tokenizer, max_length):
        recorders.append(RecordingBackend(real(tokenizer, max_length)))
        return recorders[-1]

    monkeypatch.setattr(token_bags, "truncating_backend", recording)
    return recorders


def test_a_bert_tokenizer_is_given_each_texts_first_max_length_words_only(tiny_model_dir, monkeypatch):
    """The binary index's speed-up: a BERT tokenizer tokenises a long text's first max_length
    words, not the whole text (the bags are the whole text's: tests/test_svdr.py)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    recorders = recorded_calls(monkeypatch)
    words = [f"w{i}" for i in range(300)]
    bags = bag_of_tokens(tokenizer, [" ".join(words), "short text"], 12, START, 30522 - START)
    assert [r.calls for r in recorders] == [[[" ".join(words[:12]) + " ", "short text"]]]
    assert set(bags[0].indices.tolist()) == token_set(tokenizer, " ".join(words), 12)


def test_a_tokenizer_that_cannot_be_cut_at_words_is_given_whole_texts(tiny_model_dir, monkeypatch):
    """Truncating on the left keeps a text's last tokens, so its first words are not enough: each
    text goes whole to the tokenizer, in chunks, and its bag is its last max_length tokens' set."""
    monkeypatch.setattr(token_bags, "CHUNK", 2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, truncation_side="left")
    recorders = recorded_calls(monkeypatch)
    assert not token_bags.cuts_at_words(tokenizer)
    texts = ["stars planets galaxies telescope orbit " * 5 + "recipe oven flour", "a recipe", "", "football goal"]
    bags = bag_of_tokens(tokenizer, texts, 8, START, 30522 - START)
    assert [r.calls for r in recorders] == [[texts[:2], texts[2:]]]
    for row, text in zip(bags, texts):
        ids = tokenizer(text, truncation=True, max_length=8)["input_ids"]
        assert set(row.indices.tolist()) == {i - START for i in ids if i >= START and i not in tokenizer.all_special_ids}
    assert {t - START for t in tokenizer("recipe oven flour")["input_ids"][1:-1]} <= set(bags[0].indices)


def test_a_tokenizer_without_a_rust_backend_is_refused_by_name():
    slow = type("SlowTokenizer", (), {"truncation_side": "right", "all_special_ids": [0]})()
    with pytest.raises(ValueError, match="needs a tokenizer with a Rust backend .* SlowTokenizer has none"):
        bag_of_tokens(slow, ["a text"], 8, START, 30522 - START)


def test_tokens_at_or_past_the_last_dimension_are_left_out(tiny_model_dir):
    """T(x) has vocab_size columns: a token id vocab_start + vocab_size (one past the last
    dimension) or above is not a dimension; the one just below it is, and so is vocab_start."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "stars planets galaxies telescope orbit comet!"  # "!" is id 999, the first dimension
    ids = sorted(token_set(tokenizer, text, 32, start=0))
    top, below = ids[-1], ids[-2]
    size = top - START  # the top id is one past the last column, the one below it a column
    matrix = bag_of_tokens(tokenizer, [text], 32, START, size)
    assert matrix.shape == (1, size)
    expected = {i - START for i in ids if START <= i < START + size}
    assert set(matrix.indices.tolist()) == expected
    assert {0, below - START} <= expected and top - START not in expected


# -- the retriever -------------------------------------------------------------------------------
def stand_ins(model_dir, settings: SVDRSettings, corpus: pd.DataFrame):
    """params, data and layout as SVDRRetriever.build reads them."""
    params = SimpleNamespace(retriever=SimpleNamespace(settings={"svdr": settings}.__getitem__),
                             encoder=SimpleNamespace(model_dump=lambda: {**LENGTHS, "model": "unused"}), index=IndexParams())
    data = SimpleNamespace(corpus=corpus, passages=lambda: passage_texts(corpus))
    return params, data, SimpleNamespace(encoder=model_dir)


@pytest.mark.parametrize("search", ["beta", "beta_rerank"])
@pytest.mark.parametrize("documents", [6, 1])
def test_build_indexes_the_corpus_tokens_and_reports_from_the_clock(tiny_model_dir, monkeypatch, search, documents):
    corpus = CORPUS.head(documents)
    texts = passage_texts(corpus)
    monkeypatch.setattr(svdr, "time", ScriptedClock(100.0, 100.75))
    built = SVDRRetriever.build(*stand_ins(tiny_model_dir, SVDRSettings(search=search), corpus))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    bags = binary(tokenizer, texts, LENGTHS["max_passage_length"])  # the passage length, by hand per document
    np.testing.assert_array_equal(built.index.matrix.toarray(), bags)
    assert built.index.doc_ids == corpus["doc_id"].tolist() and built.live_ids() == corpus["doc_id"].tolist()
    assert built.passages == (texts if search == "beta_rerank" else None)
    assert built.info == {"index_seconds": 0.75, "documents_per_second": documents / 0.75,
                          "nonzeros_per_document": bags.sum() / documents}
    assert built.encoder.lengths == LENGTHS and built.settings == SVDRSettings(search=search)
    assert "model" not in built.encoder.__dict__  # a binary index needs the tokenizer only


def test_build_of_the_parametric_index_holds_the_pure_top_k_passage_vectors(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(svdr, "time", ScriptedClock(0.0, 2.0))
    settings = SVDRSettings(search="full", topk=40)
    built = SVDRRetriever.build(*stand_ins(tiny_model_dir, settings, CORPUS))
    encoder = SparseEncoder(str(tiny_model_dir))
    expected = encoder.encode(passage_texts(CORPUS), "passage", 12, 40, lexical=False).toarray()
    np.testing.assert_allclose(built.index.matrix.toarray(), expected, rtol=1e-5)
    assert (expected > 0).sum(axis=1).tolist() == [40] * 6  # top-40 alone, none of the passages' own tokens
    assert built.info["nonzeros_per_document"] == 40 and built.info["index_seconds"] == 2.0


@pytest.mark.parametrize("documents", [1, 2])
def test_add_reports_milliseconds_per_document_from_the_clock(tiny_model_dir, monkeypatch, documents):
    settings = SVDRSettings(search="beta")
    retriever = SVDRRetriever(CsrStore.build(sp.csr_matrix((0, 30522 - START), dtype=np.float32), []),
                              svdr.SparseEncoderHandle(tiny_model_dir, settings, LENGTHS))
    new = pd.DataFrame({"doc_id": [f"n{i}" for i in range(documents)], "title": ["volcano"] * documents,
                        "text": ["lava magma crater"] * documents})
    monkeypatch.setattr(svdr, "time", ScriptedClock(200.0, 200.5))
    assert retriever.add(new, UpdateContext(params=None, layout=None)) == {"add_ms_per_doc": 1000 * 0.5 / documents}


@pytest.mark.parametrize("search", ["beta_rerank", "beta"])
def test_a_saved_retriever_loads_with_its_settings_lengths_and_build_facts(tiny_model_dir, tmp_path, monkeypatch,
                                                                           search):
    monkeypatch.setattr(svdr, "time", ScriptedClock(10.0, 10.5))
    settings = SVDRSettings(search=search, rerank_depth=4, topk=300, shared_encoder=False, loss="vdr")
    built = SVDRRetriever.build(*stand_ins(tiny_model_dir, settings, CORPUS))
    manifest = save_retriever(built, tmp_path / "r")
    assert manifest["svdr"] == settings.model_dump() and manifest["encoder"] == LENGTHS
    loaded = load_retriever(tmp_path / "r", tiny_model_dir)
    assert loaded.settings == settings and loaded.encoder.lengths == LENGTHS
    assert loaded.info == {"index_seconds": 0.5, "documents_per_second": 12.0,
                           "nonzeros_per_document": built.index.matrix.nnz / 6}
    assert loaded.passages == (passage_texts(CORPUS) if search == "beta_rerank" else None)  # texts to re-rank only
    assert (loaded.index.matrix != built.index.matrix).nnz == 0 and loaded.index.doc_ids == built.index.doc_ids


def test_svdr_uses_no_corpus_tree():
    assert SVDRRetriever.uses_tree is False


# -- the encoder ---------------------------------------------------------------------------------
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


def test_the_handle_loads_its_own_directory_without_the_hub(tiny_model_dir, monkeypatch):
    asked = []
    monkeypatch.setattr(svdr, "AutoTokenizer", recording_loader(svdr.AutoTokenizer, asked))
    monkeypatch.setattr(svdr, "AutoConfig", recording_loader(svdr.AutoConfig, asked))
    handle = svdr.SparseEncoderHandle(tiny_model_dir, SVDRSettings(vocab_start=1000), LENGTHS)
    assert handle.vocab_size == 30522 - 1000 and handle.tokenizer.vocab_size == 30522
    assert asked == [(tiny_model_dir, {"local_files_only": True})] * 2  # the config, then the tokenizer


@pytest.mark.parametrize("shared", [True, False])
def test_the_handle_loads_the_encoder_its_settings_describe(tiny_model_dir, shared):
    model = svdr.SparseEncoderHandle(tiny_model_dir, SVDRSettings(vocab_start=1000, shared_encoder=shared), LENGTHS).model
    assert (model.passage is model.query) is shared and model.vocab_start == 1000 and model.vocab_size == 30522 - 1000


def test_the_handle_embeds_queries_with_the_query_side_and_cuts_tokens_at_each_sides_length(tiny_model_dir, tmp_path):
    """A two-sided encoder whose sides differ: queries go through the query side; the bags of
    tokens of either side are cut at that side's length (8 query, 12 passage tokens)."""
    two_sided = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        two_sided.passage.norm.bias.fill_(0.5)
    two_sided.save(tmp_path / "enc")
    handle = svdr.SparseEncoderHandle(tmp_path / "enc", SVDRSettings(shared_encoder=False, topk=20), LENGTHS)
    query = "stars planets galaxies telescope orbit comet nebula recipe oven flour butter simmer spice dough"
    embedded = handle.embed([query], "query", lexical=False).toarray()
    weight, bias = two_sided.query.norm.weight.detach().numpy(), two_sided.query.norm.bias.detach().numpy()
    raw = hand_vectors(tmp_path / "enc", [query], 8, weight, bias)[0]
    top = np.argsort(-raw)[:20]
    np.testing.assert_allclose(embedded[0, top], raw[top], rtol=1e-4)
    assert (embedded != 0).sum() == 20
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for side, length in (("query", 8), ("passage", 12)):
        assert set(handle.tokens([query], side).indices.tolist()) == token_set(tokenizer, query, length)


class TiedPassages:
    """Re-ranked passages by hand: passage text i embeds as ``rows[i]`` (with its own tokens)."""

    def __init__(self, rows, depth: int):
        self.rows, self.settings = np.array(rows, dtype=np.float32), SVDRSettings(search="beta_rerank", rerank_depth=depth)

    def embed(self, texts, side, lexical, desc=None):
        assert side == "passage" and lexical
        return sp.csr_matrix(self.rows[[int(t) for t in texts]])


def test_passages_that_rescore_equal_keep_their_beta_order():
    """40 candidates re-scored into 4 tied groups: within a group the beta order stands."""
    n = 40
    passages = TiedPassages([[float(i % 4), 0.0] for i in range(n)], depth=n)
    retriever = SVDRRetriever(CsrStore.build(sp.csr_matrix((n, 2), dtype=np.float32), [f"d{i}" for i in range(n)]),
                              passages, passages=[str(i) for i in range(n)])
    beta_rows = np.random.default_rng(0).permutation(n)[None]
    scores, rows = retriever._rerank(sp.csr_matrix([[1.0, 0.0]]), np.linspace(100, 61, n)[None], beta_rows)
    expected = sorted(range(n), key=lambda position: (-(beta_rows[0, position] % 4), position))
    assert rows[0].tolist() == beta_rows[0, expected].tolist()
    assert scores[0].tolist() == [float(beta_rows[0, p] % 4) for p in expected]


# -- the training objective ----------------------------------------------------------------------
def test_the_objective_on_rank_1_of_2_scores_its_rows_of_texts_cut_at_their_lengths(tiny_model_dir, monkeypatch):
    """Rank 1 of 2 encodes rows 2-3 (queries cut at 5 tokens, passages at 6) and scores them
    against the gathered batch: ℓ over its own rows only, each term against NumPy."""
    encoder = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        encoder.passage.norm.bias.fill_(0.25)  # the two sides differ
    texts = dict(zip(CORPUS["doc_id"], passage_texts(CORPUS)))
    queries = ["comet telescope planets orbit stars galaxies", "butter recipe flour oven simmer spice",
               "guitar chord tempo melody rhythm lyrics", "football league referee goal coach stadium"]
    doc_ids = ["d0", "d1", "d4", "d3"]
    passages = [texts[d] for d in doc_ids]
    batch = pd.DataFrame({"query": queries, "doc_id": doc_ids, "positives": [{d} for d in doc_ids]})

    def encoded(strings, length, side):
        tokens = encoder.tokenize(strings, length)
        return torch.cat([encoder(tokens, side), encoder.lexical(tokens)], dim=1)

    with torch.no_grad():
        other_rank = [encoded(queries[:2], 5, "query"), encoded(passages[:2], 6, "passage")]  # rank 0's rows
    monkeypatch.setattr(objectives, "local_slice", lambda size: slice(size // 2, size))
    monkeypatch.setattr(objectives, "gather_with_grad", lambda local: torch.cat([other_rank.pop(0), local]))
    objective = SVDRObjective(encoder, [Stream("s", iter([batch]), 1.0)], texts.__getitem__, 5, 6, topk=50,
                              variant="svdr")
    loss, parts = objective()
    tokenizer = encoder.tokenizer
    assert all(len(tokenizer(t)["input_ids"]) > 6 for t in queries + passages)  # every text is cut
    with torch.no_grad():
        q = encoder(encoder.tokenize(queries, 5), "query").double().numpy()
        p = encoder(encoder.tokenize(passages, 6), "passage").double().numpy()
    bin_q, bin_p = binary(tokenizer, queries, 5), binary(tokenizer, passages, 6)
    rows = slice(2, 4)
    expected = {"q_k.p": ell(sparsified(q, bin_q, 50), p, rows), "q.p_k": ell(q, sparsified(p, bin_p, 50), rows),
                "bin_q.p": ell(bin_q, p, rows), "q.bin_p": ell(q, bin_p, rows)}
    assert {k: parts[f"s.{k}"] for k in expected} == pytest.approx(expected, rel=1e-4)
    assert loss.item() == pytest.approx(sum(expected.values()) / 4, rel=1e-4)


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
