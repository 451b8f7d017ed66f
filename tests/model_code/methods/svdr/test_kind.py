"""Kind ``svdr`` against independent computations: the sparse encoder against the formula in NumPy
(one text at a time, so no padding), the bag of tokens and the binary index against token sets
taken from the tokenizer per document, each search mode against dense matrix products, each loss
term against a hand-written example; then the kind through the pipeline, registry and pyfunc, and
a beta addition that never loads the model."""

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import yaml
from transformers import AutoModel, AutoTokenizer

from model_code.cli import main
from model_code.config import load_params
from model_code.data.ingested import load_ingested, passage_texts
from model_code.layout import Layout
from model_code.methods.svdr import model as sparse_encoder
from model_code.methods.svdr import token_bags
from model_code.methods.svdr.loss import svdr_loss, symmetric_nll
from model_code.methods.svdr.model import SparseEncoder, sparsify
from model_code.methods.svdr.retriever import SparseEncoderHandle, SVDRRetriever, SVDRSettings
from model_code.methods.svdr.token_bags import bag_of_tokens
from model_code.methods.svdr.training import SVDRObjective
from model_code.retrievers import load_chain, load_retriever, save_retriever, save_retriever_delta
from model_code.retrievers.base import UpdateContext
from model_code.stores.csr_store import CsrStore
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import Stream
from model_code.versions.chain import RetrieverVersions
from tests.conftest import run_stages, tiny_params
from tests.test_updates import write_batch
from tracking.registry import register

START = 999  # BERT's first kept id; the tiny model uses MiniLM's (BERT's) vocabulary
TEXTS = ["stars planets galaxies telescope orbit", "a recipe", "recipe oven flour butter butter butter simmer"]


def token_set(tokenizer, text: str, max_length: int, start: int = START) -> set[int]:
    """Columns of a text's bag of tokens, one document at a time from the tokenizer's ids."""
    ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
    return {i - start for i in ids if i >= start and i not in tokenizer.all_special_ids}


def layer_norm(h: np.ndarray, weight=1.0, bias=0.0) -> np.ndarray:
    """The encoder's new LayerNorm over each token's hidden state (eps 1e-5), in NumPy."""
    return (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-5) * weight + bias


def hand_vectors(model_dir, texts: list[str], max_length: int, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """ELU1p(LN(H) · E[999:]ᵀ) per token, max over tokens, in NumPy; one text at a time."""
    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    words = model.get_input_embeddings().weight.detach().numpy()[START:]
    out = []
    with torch.no_grad():
        for text in texts:
            h = model(**tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")).last_hidden_state[0]
            x = layer_norm(h.numpy().astype(np.float64), weight, bias) @ words.T
            out.append(np.where(x >= 0, x + 1, np.exp(np.minimum(x, 0))).max(axis=0))
    return np.stack(out)


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


# -- encoder -----------------------------------------------------------------------------------
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


# -- binary token index ------------------------------------------------------------------------
def test_binary_index_is_each_documents_token_set(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(token_bags, "CHUNK", 2)  # several tokenizer calls
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = [*TEXTS, "", "long " * 50 + "tail words past the cut", "[CLS] unknown ☃ tokens"]
    matrix = bag_of_tokens(tokenizer, texts, 12, START, 30522 - START)
    assert matrix.shape == (len(texts), 30522 - START) and matrix.dtype == np.float32
    for row, text in zip(matrix, texts):
        assert set(row.indices.tolist()) == token_set(tokenizer, text, 12), text
        assert set(row.data.tolist()) <= {1.0}  # binary, not term frequency
    whole = bag_of_tokens(tokenizer, texts, 12, 0, 30522)  # every id a dimension: specials still never count
    for row, text in zip(whole, texts):
        assert set(row.indices.tolist()) == token_set(tokenizer, text, 12, start=0), text


@pytest.mark.parametrize("max_length", [12, 5])
def test_cutting_texts_after_their_first_words_keeps_their_first_tokens(tiny_model_dir, monkeypatch, max_length):
    """bag_of_tokens tokenises each text's first max_length words only: the same bags as whole
    texts, also where words give no token (the prefix falls short, even by one token, and the
    whole text is tokenised again, in whatever chunk), where a word gives many, and where a
    separator is whitespace to Python but not to BERT."""
    monkeypatch.setattr(token_bags, "CHUNK", 3)  # texts tokenised again sit in later chunks too
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert token_bags.cuts_at_words(tokenizer)
    texts = ["\u0301 " * 20 + "real words after empty ones", "\x00 \x07 " * 10 + "after control characters",
             "one\x1ctwo\x1cthree\x1cfour " * 20, "数学物理化学生物 " * 20, "a,b,c,d,e,f,g,h " * 20,
             "word " * (max_length - 1), "word " * max_length + "x", "nbsp\u00a0" * 30,
             "  leading   spaces\t\ttabs\n\nnewlines\r\n " * 5, "", "short",
             "\x1c".join(["qz"] * 60) + " tail" * 20,  # one 120-character word to BERT ([UNK]), 60 to Python
             "\u0301 " * 3 + "w " * (max_length - 3) + "zebra lion tiger",  # the prefix is one token short
             "\u0301 " * 20 + "late words"]  # tokenised again from a later chunk
    short = [a for a, b in zip(token_bags.word_prefixes(texts, max_length), texts) if len(a) < len(b)]
    assert len(short) >= 6  # the cut is exercised
    assert len(tokenizer(token_bags.word_prefixes(texts[:1], max_length)[0])["input_ids"]) < max_length  # and the redo
    matrix = bag_of_tokens(tokenizer, texts, max_length, START, 30522 - START)
    for row, text in zip(matrix, texts):
        assert set(row.indices.tolist()) == token_set(tokenizer, text, max_length), repr(text)


def test_a_text_with_fewer_words_than_the_cut_is_kept_whole_at_once():
    """Many whitespace runs and fewer words than max_length: a pattern that can split a run in
    several ways backtracks through all of them (it hung on SciFact abstracts at 256 tokens)."""
    import subprocess
    import sys

    code = ("from model_code.methods.svdr.token_bags import word_prefixes; t = 'word  ' * 100; "
            "assert word_prefixes([t, t + 'x ' * 300], 256) == [t, t + 'x ' * 156]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sparse_index_search_add_and_remove_against_numpy(tmp_path):
    rng = np.random.default_rng(0)
    dense = rng.random((6, 9)) * (rng.random((6, 9)) < 0.5)
    index = CsrStore.build(sp.csr_matrix(dense.astype(np.float32)), [f"d{i}" for i in range(6)])
    queries = rng.random((3, 9)).astype(np.float32)
    scores, rows = index.search_rows(sp.csr_matrix(queries), 4)
    expected = queries @ dense.T
    np.testing.assert_array_equal(rows, np.argsort(-expected, axis=1, kind="stable")[:, :4])
    np.testing.assert_allclose(scores, np.sort(expected, axis=1)[:, ::-1][:, :4], rtol=1e-5)

    extra = rng.random((2, 9))
    index.add(sp.csr_matrix(extra.astype(np.float32)), ["d6", "d1b"])
    assert index.remove(["d1", "d4"]) == 2
    index.add(sp.csr_matrix(extra[:1].astype(np.float32)), ["d1"])  # a removed id comes back as a new row
    with pytest.raises(ValueError, match="already indexed"):
        index.add(sp.csr_matrix(extra[:1].astype(np.float32)), ["d6"])
    with pytest.raises(KeyError, match="d4"):
        index.remove(["d4"])
    index.save(tmp_path / "index")
    loaded = CsrStore.load_files(tmp_path / "index")
    assert loaded.live_ids() == ["d0", "d2", "d3", "d5", "d6", "d1b", "d1"]
    all_rows = np.vstack([dense, extra, extra[:1]])
    live = [0, 2, 3, 5, 6, 7, 8]
    scores, rows = loaded.search_rows(sp.csr_matrix(queries), 10)  # cut to the 7 live rows
    row_ids = ["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d1b", "d1"]
    for q, s, r, ids in zip(queries, scores, rows, loaded.search(sp.csr_matrix(queries), 10)[1]):
        by_hand = {row: float(q @ all_rows[row]) for row in live}
        assert r.tolist() == sorted(by_hand, key=lambda row: (-by_hand[row], row))
        assert ids == [row_ids[row] for row in r]  # the store's search: the same hits, by id
        np.testing.assert_allclose(s, [by_hand[row] for row in r], rtol=1e-5)
    assert loaded.remove(["d1"]) == 1 and loaded.live.tolist() == [True, False, True, True, False, True, True, True, False]


# -- search modes --------------------------------------------------------------------------------
CORPUS = pd.DataFrame({
    "doc_id": [f"d{i}" for i in range(6)],
    "title": ["stars", "oven", "", "goal", "melody", "stars oven"],
    "text": ["planets telescope orbit comet", "recipe flour butter", "dose vaccine trial patient",
             "football league referee", "chord guitar tempo", "a comet seen while baking bread"],
})
QUERIES = ["comet telescope", "butter recipe", "guitar chord tempo"]
LENGTHS = {"max_query_length": 8, "max_passage_length": 12, "batch_size": 4}
# A random model's own tokens rank high in its vectors: a small top-k makes the lexical OR matter,
# a large one lets a query's few tokens meet the documents' kept dimensions (alpha)
TOPK = {"full": 3000, "alpha": 10000, "beta": 3000, "beta_rerank": 3000}


def mode_retriever(model_dir, search: str, rerank_depth: int = 3) -> SVDRRetriever:
    settings = SVDRSettings(search=search, topk=TOPK[search], rerank_depth=rerank_depth)
    handle = SparseEncoderHandle(model_dir, settings, LENGTHS)
    texts = passage_texts(CORPUS)
    return SVDRRetriever(CsrStore.build(handle.index_rows(texts), CORPUS["doc_id"].tolist()), handle,
                         texts if search == "beta_rerank" else None)


def binary(tokenizer, texts, max_length) -> np.ndarray:
    out = np.zeros((len(texts), 30522 - START))
    for row, text in zip(out, texts):
        row[sorted(token_set(tokenizer, text, max_length))] = 1
    return out


def check_ranking(hit, scores: np.ndarray, k: int):
    order = np.argsort(-scores, kind="stable")[:k]
    assert hit.doc_ids == CORPUS["doc_id"].iloc[order].tolist()
    np.testing.assert_allclose(hit.scores, scores[order], rtol=1e-4)


@pytest.fixture(scope="module")
def vectors(tiny_model_dir):
    """Per top-k: dense copies of what the encoder makes (tested above); the binary vectors by hand."""
    model = SparseEncoder(str(tiny_model_dir))
    tokenizer, texts = model.tokenizer, passage_texts(CORPUS)
    out = {"bin_q": binary(tokenizer, QUERIES, 8), "bin_p": binary(tokenizer, texts, 12)}
    for topk in set(TOPK.values()):
        out[topk] = {
            "q": model.encode(QUERIES, "query", 8, topk, lexical=True).toarray(),
            "q_pure": model.encode(QUERIES, "query", 8, topk, lexical=False).toarray(),
            "p": model.encode(texts, "passage", 12, topk, lexical=False).toarray(),  # the full/alpha index
            "p_lex": model.encode(texts, "passage", 12, topk, lexical=True).toarray(),  # re-ranked passages
        }
    return out


@pytest.mark.parametrize("search, left, right", [("full", "q", "p"), ("alpha", "bin_q", "p"), ("beta", "q", "bin_p")])
def test_each_search_mode_scores_its_matrix_product(tiny_model_dir, vectors, search, left, right):
    retriever = mode_retriever(tiny_model_dir, search)
    v = {**vectors, **vectors[TOPK[search]]}
    scores = v[left] @ v[right].T
    assert (scores > 0).sum(axis=1).min() >= 2  # not a ranking of ties
    if left == "q":  # the query's own tokens matter to this example
        assert not np.allclose(scores, v["q_pure"] @ v[right].T)
    for hit, row in zip(retriever.search(QUERIES, 4), scores):
        check_ranking(hit, row, 4)
    stored = "p" if search in ("full", "alpha") else "bin_p"
    np.testing.assert_allclose(retriever.index.matrix.toarray(), v[stored], rtol=1e-5)


@pytest.mark.parametrize("search", ["full", "beta"])
def test_with_two_encoders_queries_go_through_the_query_side_and_documents_the_passage_side(
        tiny_model_dir, tmp_path, search):
    """Separate sides whose LayerNorms differ: the scores are query-side query vectors against
    passage-side document vectors (full) or the documents' tokens (beta), so a search that encodes
    queries with the passage side, or an index built by the query side, ranks otherwise."""
    two_sided = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        two_sided.query.norm.bias.fill_(0.3)
        two_sided.passage.norm.bias.fill_(-0.2)
    two_sided.save(tmp_path)
    texts, topk = passage_texts(CORPUS), TOPK[search]
    handle = SparseEncoderHandle(tmp_path, SVDRSettings(search=search, topk=topk, shared_encoder=False), LENGTHS)
    retriever = SVDRRetriever(CsrStore.build(handle.index_rows(texts), CORPUS["doc_id"].tolist()), handle)
    queries = two_sided.encode(QUERIES, "query", 8, topk, lexical=True).toarray()
    documents = (two_sided.encode(texts, "passage", 12, topk, lexical=False).toarray() if search == "full"
                 else binary(two_sided.tokenizer, texts, 12))
    wrong_side = two_sided.encode(QUERIES, "passage", 8, topk, lexical=True).toarray()
    assert not np.allclose(queries @ documents.T, wrong_side @ documents.T)
    np.testing.assert_allclose(retriever.index.matrix.toarray(), documents, rtol=1e-5)
    for hit, row in zip(retriever.search(QUERIES, 4), queries @ documents.T):
        check_ranking(hit, row, 4)


def test_beta_rerank_rescores_the_top_m_and_keeps_the_rest_in_beta_order(tiny_model_dir, vectors):
    retriever = mode_retriever(tiny_model_dir, "beta_rerank", rerank_depth=3)
    v = vectors[TOPK["beta_rerank"]]
    beta = v["q"] @ vectors["bin_p"].T
    full = v["q"] @ v["p_lex"].T
    for hit, b, f in zip(retriever.search(QUERIES, 5), beta, full):
        head = np.argsort(-b, kind="stable")[:3]
        head = head[np.argsort(-f[head], kind="stable")]
        tail = np.argsort(-b, kind="stable")[3:5]
        assert hit.doc_ids == CORPUS["doc_id"].iloc[[*head, *tail]].tolist()
        np.testing.assert_allclose(hit.scores[:3], f[head], rtol=1e-4)
        assert all(a > b for a, b in zip(hit.scores, hit.scores[1:]))  # one order, whatever sorts by score
    [short] = retriever.search(QUERIES[:1], 2)  # k < m: the best two of the re-scored three
    assert short.doc_ids == retriever.search(QUERIES[:1], 3)[0].doc_ids[:2]


class StubEncoder:
    """Passage vectors given by hand: each passage text is its vector's index in ``rows``;
    passages embedded without their own tokens come out as zeros."""

    settings = SVDRSettings(search="beta_rerank", rerank_depth=2)

    def __init__(self, rows):
        self.rows = np.array(rows, dtype=np.float32)

    def embed(self, texts, side, lexical, desc=None):
        assert side == "passage"
        return sp.csr_matrix(self.rows[[int(t) for t in texts]] * lexical)


def test_rerank_by_hand():
    # beta ranked rows 3, 0, 1, 2 (scores 10, 9, 8, 7); m = 2 re-scores rows 3 and 0 by q · E(d)
    retriever = SVDRRetriever(CsrStore.build(sp.csr_matrix((4, 2), dtype=np.float32), list("abcd")),
                              StubEncoder([[0.5, 0.0], [9, 9], [9, 9], [0.25, 0.5]]), passages=["0", "1", "2", "3"])
    scores, rows = retriever._rerank(sp.csr_matrix([[1.0, 1.0]]), np.array([[10.0, 9, 8, 7]]), np.array([[3, 0, 1, 2]]))
    assert rows.tolist() == [[3, 0, 1, 2]]  # 0.75 before 0.5
    assert scores.tolist() == [[0.75, 0.5, 8 - 8 + 0.5 - 1, 7 - 8 + 0.5 - 1]]  # the tail shifted below the head
    _, rows = retriever._rerank(sp.csr_matrix([[1.0, -1.0]]), np.array([[10.0, 9, 8, 7]]), np.array([[3, 0, 1, 2]]))
    assert rows.tolist() == [[0, 3, 1, 2]]  # 0.5 before -0.25


def test_a_beta_addition_appends_token_rows_without_loading_the_model(tiny_model_dir, vectors):
    retriever = mode_retriever(tiny_model_dir, "beta")
    reloaded = SVDRRetriever(retriever.index, SparseEncoderHandle(tiny_model_dir, retriever.settings, LENGTHS))
    new = pd.DataFrame({"doc_id": ["n1"], "title": ["volcano"], "text": ["lava magma crater"]})
    timing = reloaded.add(new, UpdateContext(params=None, layout=None))
    assert "model" not in reloaded.encoder.__dict__ and timing["add_ms_per_doc"] > 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    np.testing.assert_array_equal(reloaded.index.matrix[-1].toarray(), binary(tokenizer, passage_texts(new), 12))
    assert reloaded.remove(["d0"]) == 1 and reloaded.live_ids() == ["d1", "d2", "d3", "d4", "d5", "n1"]
    assert reloaded.search(["volcano lava"], 1)[0].doc_ids == ["n1"]


def test_a_delta_replays_onto_its_base_as_the_update_left_it(tiny_model_dir, tmp_path):
    save_retriever(mode_retriever(tiny_model_dir, "beta_rerank"), tmp_path / "base")
    updated = load_retriever(tmp_path / "base", tiny_model_dir)
    new = pd.DataFrame({"doc_id": ["n1", "n2"], "title": ["volcano", "ice"], "text": ["lava magma", "glacier snow"]})
    updated.add(new, UpdateContext(params=None, layout=None))
    updated.remove(["d2", "n2"])  # a base row and a row of this same update
    assert save_retriever_delta(updated, tmp_path / "delta")["delta"]
    assert CsrStore.load_files(tmp_path / "delta" / "index_delta").doc_ids == ["n1", "n2"]  # the new rows only
    replayed = load_chain([tmp_path / "base", tmp_path / "delta"], tiny_model_dir)
    assert replayed.live_ids() == updated.live_ids() == ["d0", "d1", "d3", "d4", "d5", "n1"]
    assert replayed.passages == updated.passages and (replayed.index.matrix != updated.index.matrix).nnz == 0
    assert replayed.search(QUERIES, 6) == updated.search(QUERIES, 6)
    assert replayed.search(["volcano lava magma"], 1)[0].doc_ids == ["n1"]  # re-ranked from its stored text
    with pytest.raises(ValueError, match="made from another version"):
        replayed.apply_delta(tmp_path / "delta", {})


# -- loss ----------------------------------------------------------------------------------------
def ell(a: np.ndarray, b: np.ndarray, rows=slice(None), excluded: np.ndarray | None = None) -> float:
    """ℓ(A, B) in NumPy: ½ [query -> every passage CE + positive passage -> every query CE]."""
    n = len(a)
    forward, backward = a @ b.T, b[:n] @ a.T
    if excluded is not None:
        forward[excluded], backward[excluded[:, :n].T] = -np.inf, -np.inf

    def ce(scores):
        return (np.log(np.exp(scores).sum(1)) - np.diag(scores[:, :n]))[rows].mean()

    return 0.5 * (ce(forward) + ce(backward))


Q = [[3.0, 1.0, 0.5, 2.0], [0.2, 4.0, 1.0, 0.1]]
P = [[2.5, 0.3, 1.0, 0.2], [0.1, 3.0, 0.2, 1.5]]
BIN_Q = [[1.0, 0, 0, 1.0], [0, 1.0, 0, 0]]
BIN_P = [[1.0, 0, 1.0, 0], [0, 0, 0, 1.0]]
Q_K = [[3.0, 0, 0, 2.0], [0, 4.0, 0, 0]]  # top-1 of each row, or a token of the query
P_K = [[2.5, 0, 1.0, 0], [0, 3.0, 0, 1.5]]


def as_tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)  # a confident row's loss is ~1e-5: beyond float32's digits


def test_symmetric_nll_by_hand():
    eye = torch.eye(2)
    # each direction: -log(e / (e + 1)) = log(1 + 1/e) for both rows
    assert symmetric_nll(eye, eye, slice(0, 2)).item() == pytest.approx(np.log(1 + np.exp(-1)), rel=1e-6)


def test_each_term_of_the_semi_parametric_loss():
    q, p, bin_q, bin_p = map(as_tensor, (Q, P, BIN_Q, BIN_P))
    loss, parts = svdr_loss(q, p, bin_q, bin_p, topk=1)
    q_, p_, bin_q_, bin_p_, q_k, p_k = map(np.array, (Q, P, BIN_Q, BIN_P, Q_K, P_K))
    expected = {"q_k.p": ell(q_k, p_), "q.p_k": ell(q_, p_k), "bin_q.p": ell(bin_q_, p_), "q.bin_p": ell(q_, bin_p_)}
    assert parts == pytest.approx(expected, rel=1e-5)
    assert loss.item() == pytest.approx(sum(expected.values()) / 4, rel=1e-5)
    vdr, vdr_parts = svdr_loss(q, p, bin_q, bin_p, topk=1, variant="vdr")
    assert set(vdr_parts) == {"q_k.p", "bin_q.p"}
    assert vdr.item() == pytest.approx((expected["q_k.p"] + expected["bin_q.p"]) / 2, rel=1e-5)


def test_the_loss_gradient_reaches_q_and_p_through_every_term():
    """Autograd of the loss against autograd of the four terms written out here with torch
    primitives, the top-k ∪ lexical masks fixed as constants (Q_K, P_K): a term whose sparsified
    side carries no gradient (detached, built under no_grad) changes q's or p's gradient."""
    q, p = as_tensor(Q).requires_grad_(), as_tensor(P).requires_grad_()
    svdr_loss(q, p, as_tensor(BIN_Q), as_tensor(BIN_P), topk=1)[0].backward()

    def ell_torch(a, b):
        forward, backward = a @ b.T, b @ a.T
        return 0.5 * sum((scores.logsumexp(1) - scores.diagonal()).mean() for scores in (forward, backward))

    q_ref, p_ref = as_tensor(Q).requires_grad_(), as_tensor(P).requires_grad_()
    keep_q, keep_p = as_tensor(Q_K) != 0, as_tensor(P_K) != 0
    reference = (ell_torch(q_ref * keep_q, p_ref) + ell_torch(q_ref, p_ref * keep_p)
                 + ell_torch(as_tensor(BIN_Q), p_ref) + ell_torch(q_ref, as_tensor(BIN_P))) / 4
    reference.backward()
    torch.testing.assert_close(q.grad, q_ref.grad)
    torch.testing.assert_close(p.grad, p_ref.grad)
    assert (q.grad[~keep_q] != 0).all()  # dropped dimensions still learn through the other terms


def test_the_loss_with_hard_negatives_known_positives_and_one_ranks_rows():
    negative = [[0.5, 0.5, 2.0, 1.0]]
    q, p, bin_q, bin_p = map(as_tensor, (Q, P + negative, BIN_Q, BIN_P + [[0, 0, 1.0, 1.0]]))
    p_k = np.array(P_K + [[0, 0, 2.0, 1.0]])  # the negative's top-1 is dim 2, its tokens dims 2 and 3
    # passage 1 is also relevant to query 0; the negative is relevant to query 1
    excluded = torch.tensor([[False, True, False], [False, False, True]])
    for rows in (slice(1, 2), slice(0, 2)):  # one rank's row of the global batch, and all of it
        _, parts = svdr_loss(q, p, bin_q, bin_p, topk=1, rows=rows, excluded=excluded)
        expected = ell(np.array(Q), p_k, rows=rows, excluded=excluded.numpy())
        assert parts["q.p_k"] == pytest.approx(expected, rel=1e-5)
    _, parts = svdr_loss(q, p, bin_q, bin_p, topk=1)  # nothing excluded: the negative counts for both queries
    assert parts["q.p_k"] == pytest.approx(ell(np.array(Q), p_k), rel=1e-5)


def sparsified(v: np.ndarray, bags: np.ndarray, topk: int) -> np.ndarray:
    keep = bags.astype(bool)
    np.put_along_axis(keep, np.argsort(-v, axis=1)[:, :topk], True, axis=1)
    return v * keep


def test_the_training_objective_is_the_loss_of_the_encoded_batch_and_its_hard_negatives(tiny_model_dir):
    encoder = SparseEncoder(str(tiny_model_dir), shared=False)
    with torch.no_grad():
        encoder.passage.norm.bias.fill_(0.25)  # the two sides differ
    texts = dict(zip(CORPUS["doc_id"], passage_texts(CORPUS)))
    batch = pd.DataFrame({"query": QUERIES, "doc_id": ["d0", "d1", "d4"],
                          "positives": [{"d0", "d1"}, {"d1"}, {"d4", "d3"}]})  # d1 is also relevant to query 0
    mined = pd.DataFrame({"query": QUERIES, "doc_id": ["d3", "d2", "d5"]})  # one per query: the draw is fixed
    objective = SVDRObjective(encoder, [Stream("s", iter([batch]), 1.0)], texts.__getitem__, 8, 12, topk=50,
                              variant="svdr", hard_negatives=HardNegatives(mined, 1, seed=0))
    loss, parts = objective()
    tokenizer = encoder.tokenizer
    passages = [texts[d] for d in ["d0", "d1", "d4", "d3", "d2", "d5"]]  # the positives, then the negatives
    with torch.no_grad():
        q = encoder(encoder.tokenize(QUERIES, 8), "query").double().numpy()
        p = encoder(encoder.tokenize(passages, 12), "passage").double().numpy()
    bin_q, bin_p = binary(tokenizer, QUERIES, 8), binary(tokenizer, passages, 12)
    # d1 is no negative of query 0; d3, query 0's negative, is relevant to query 2
    excluded = np.array([[False, True, False, False, False, False],
                         [False, False, False, False, False, False],
                         [False, False, False, True, False, False]])
    expected = {"q_k.p": ell(sparsified(q, bin_q, 50), p, excluded=excluded),
                "q.p_k": ell(q, sparsified(p, bin_p, 50), excluded=excluded),
                "bin_q.p": ell(bin_q, p, excluded=excluded), "q.bin_p": ell(q, bin_p, excluded=excluded)}
    assert {k: parts[f"s.{k}"] for k in expected} == pytest.approx(expected, rel=1e-4)
    assert loss.item() == pytest.approx(sum(expected.values()) / 4, rel=1e-4)
    loss.backward()  # both sides and their LayerNorms train
    assert encoder.query.norm.weight.grad is not None and encoder.passage.norm.weight.grad is not None


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


# -- the kind in the pipeline ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def svdr_workspace(tmp_path_factory, tiny_model_dir):
    from tests.conftest import write_beir

    tmp = tmp_path_factory.mktemp("svdr")
    root = tmp / "workspace"
    params = tiny_params(write_beir(tmp / "beir"), tiny_model_dir, train={"enabled": False},
                         retriever={"kind": "svdr", "svdr": {"search": "beta_rerank", "rerank_depth": 5}})
    run_stages(root, params, "ingest", "querygen", "cluster", "train", "index", "evaluate")
    return root


def test_the_train_stage_trains_the_sparse_encoder_and_the_index_stage_uses_it(tmp_path, beir_dir, tiny_model_dir):
    params = tiny_params(beir_dir, tiny_model_dir, retriever={"kind": "svdr", "svdr": {"shared_encoder": False,
                                                                                        "search": "full", "topk": 100}})
    layout = run_stages(tmp_path / "ws", params, "ingest", "querygen", "cluster", "train", "index", "evaluate")
    steps = pd.read_csv(layout.train_report / "steps.csv")
    assert len(steps) == 3 and {"joint.q_k.p", "joint.q.p_k", "joint.bin_q.p", "joint.q.bin_p"} <= set(steps.columns)
    trained = SparseEncoder(str(layout.encoder), shared=False)
    assert not torch.equal(trained.query.norm.weight, torch.ones(32))  # the LayerNorm trained and was saved
    assert (layout.encoder / "passage" / "config.json").is_file()
    retriever = load_retriever(layout.retriever, layout.encoder)
    texts = passage_texts(load_ingested(layout.ingested).corpus)
    expected = trained.encode(texts, "passage", 32, 100, lexical=False).toarray()
    np.testing.assert_allclose(retriever.index.matrix.toarray(), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="train.method contrastive"):
        from model_code.stages import train

        train.run(load_params(layout.root / "params.yaml", {"train": {"method": "hce"}}), layout)


def first_step(tmp_path, beir_dir, tiny_model_dir, name: str, **svdr) -> pd.Series:
    """The train stage's first logged step (before any update) for these ``retriever.svdr`` settings."""
    params = tiny_params(beir_dir, tiny_model_dir, train={"data": "supervised", "max_steps": 1},
                         retriever={"kind": "svdr", "svdr": {"search": "beta", **svdr}})
    return pd.read_csv(run_stages(tmp_path / name, params, "ingest", "train").train_report / "steps.csv").iloc[0]


def test_the_train_stage_optimises_the_loss_and_top_k_that_params_name(tmp_path, beir_dir, tiny_model_dir):
    """Same seed, same first batch, same model: ``loss: vdr`` logs exactly its two terms, with the
    loss their mean, equal to svdr's same two terms; ``topk`` moves only the terms that sparsify
    the encoder's vectors. A stage that passed the default loss or top-k fails one of these."""
    svdr = first_step(tmp_path, beir_dir, tiny_model_dir, "svdr", loss="svdr", topk=3000)
    vdr = first_step(tmp_path, beir_dir, tiny_model_dir, "vdr", loss="vdr", topk=3000)
    lexical_only = first_step(tmp_path, beir_dir, tiny_model_dir, "lexical", loss="svdr", topk=0)
    every, shared = ["q_k.p", "q.p_k", "bin_q.p", "q.bin_p"], ["q_k.p", "bin_q.p"]
    column = lambda names: [f"supervised.{name}" for name in names]
    assert sorted(c for c in vdr.index if c.startswith("supervised.")) == sorted(column(shared))
    assert vdr["loss"] == pytest.approx(vdr[column(shared)].mean(), rel=1e-5)
    assert svdr["loss"] == pytest.approx(svdr[column(every)].mean(), rel=1e-5)
    assert vdr[column(shared)].tolist() == pytest.approx(svdr[column(shared)].tolist(), rel=1e-5)
    moved = {name for name in every
             if lexical_only[f"supervised.{name}"] != pytest.approx(svdr[f"supervised.{name}"], rel=1e-5)}
    assert moved == {"q_k.p", "q.p_k"}


def test_the_index_stage_writes_the_binary_index_of_the_corpus(svdr_workspace):
    layout = Layout(svdr_workspace)
    manifest = json.loads((layout.retriever / "manifest.json").read_text())
    assert manifest["kind"] == "svdr" and manifest["svdr"]["search"] == "beta_rerank" and manifest["documents"] == 48
    retriever = load_retriever(layout.retriever, layout.encoder)
    corpus = load_ingested(layout.ingested).corpus
    tokenizer = AutoTokenizer.from_pretrained(layout.encoder)
    np.testing.assert_array_equal(retriever.index.matrix.toarray(), binary(tokenizer, passage_texts(corpus), 32))
    assert json.loads((layout.eval_report / "metrics.json").read_text())["retriever"] == "svdr"


def test_an_svdr_retriever_is_registered_served_and_updated(svdr_workspace, tmp_path, mlflow_uri):
    root, layout = svdr_workspace, Layout(svdr_workspace)
    uri = mlflow_uri
    result = register(load_params(root / "params.yaml"), layout, tracking_uri=uri)
    assert result["retriever"] == "svdr"
    mlflow.set_tracking_uri(uri)
    answer = mlflow.pyfunc.load_model(result["model_uri"]).predict(["recipe oven flour butter"], params={"k": 3})
    direct = load_retriever(layout.retriever, layout.encoder).search(["recipe oven flour butter"], 3)[0]
    assert answer["doc_ids"][0] == direct.doc_ids

    batch = write_batch(tmp_path / "new.jsonl", [{"_id": "volcano", "title": "volcano", "text": "lava magma crater"}])
    args = ["--params", str(root / "params.yaml"), "--root", str(root)]
    assert main(["add-documents", str(batch), *args]) == 0
    assert main(["remove-documents", "astronomy-0", *args]) == 0
    current = RetrieverVersions(layout).load()
    assert "volcano" in current.live_ids() and "astronomy-0" not in current.live_ids()
    assert current.search(["volcano. lava magma crater"], 1)[0].doc_ids == ["volcano"]


def test_the_dagster_asset_graph_runs_the_svdr_kind(tmp_path, beir_dir, tiny_model_dir):
    """The pipeline's assets up to evaluation with retriever.kind svdr (registration is the CLI's
    and dvc repro's test): corpus_tree is a not_used stand-in, the sparse encoder trains, the
    binary index is built and evaluated."""
    import dagster as dg

    from orchestration.jobs import PIPELINE_ASSETS
    from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource

    root = tmp_path / "svdr-workspace"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir, retriever={"kind": "svdr"})))
    selected = [asset for asset in PIPELINE_ASSETS if asset.key.to_user_string() != "registered_model"]
    result = dg.materialize(selected, resources={
        "params": ParamsResource(path=str(root / "params.yaml")), "workspace": WorkspaceResource(root=str(root)),
        "mlflow_store": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")})
    assert result.success
    metadata = {node: result.asset_materializations_for_node(node)[0].metadata
                for node in ("corpus_tree", "encoder", "retriever_index", "evaluation")}
    assert metadata["corpus_tree"]["used"].value is False
    assert metadata["corpus_tree"]["reason"].value == "retriever.kind svdr uses no corpus tree"
    assert metadata["encoder"]["steps"].value == 3
    assert metadata["retriever_index"]["kind"].value == "svdr"
    assert metadata["evaluation"]["queries"].value == 12
    layout = Layout(root)
    assert json.loads((layout.final_tree / "not_used.json").read_text())["used"] is False
    retriever = load_retriever(layout.retriever, layout.encoder)
    corpus = load_ingested(layout.ingested).corpus
    tokenizer = AutoTokenizer.from_pretrained(layout.encoder)
    np.testing.assert_array_equal(retriever.index.matrix.toarray(), binary(tokenizer, passage_texts(corpus), 32))
