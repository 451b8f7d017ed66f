"""Kind ``svdr``'s retriever (``model_code/methods/svdr/retriever.py``) against independent
computations: each search mode against dense matrix products of the encoder's vectors, beta_rerank
against a re-scoring by hand (equal re-scores keep their beta order), ``build`` and ``add`` with
stand-ins and a scripted clock, what a saved retriever keeps, a beta addition that never loads the
model, a delta replayed on its base, and the encoder handle's sides, lengths and files (SVDR,
arXiv:2405.01924; the reference's facts in the design notes, §3)."""

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
from model_code.methods.svdr import retriever as svdr
from model_code.methods.svdr.model import SparseEncoder
from model_code.methods.svdr.retriever import SparseEncoderHandle, SVDRRetriever, SVDRSettings
from model_code.retrievers import load_chain, load_retriever, save_retriever, save_retriever_delta
from model_code.retrievers.base import SearchHit, UpdateContext
from model_code.stores.csr_store import CsrStore
from tests.conftest import recording_loader
from tests.helpers.svdr import CORPUS, LENGTHS, QUERIES, START, binary, hand_vectors, token_set


class ScriptedClock:
    """time.perf_counter for the svdr module: each call returns the next of the given instants."""

    def __init__(self, *instants: float):
        self.instants = list(instants)

    def perf_counter(self) -> float:
        return self.instants.pop(0)


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
    assert built.passages == (dict(zip(corpus["doc_id"], texts)) if search == "beta_rerank" else None)
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
    expected = dict(zip(CORPUS["doc_id"], passage_texts(CORPUS)))
    assert loaded.passages == (expected if search == "beta_rerank" else None)  # texts to re-rank only, by id
    assert (loaded.index.matrix != built.index.matrix).nnz == 0 and loaded.index.doc_ids == built.index.doc_ids


def test_svdr_uses_no_corpus_tree():
    assert SVDRRetriever.uses_tree is False


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
                              passages, passages={f"d{i}": str(i) for i in range(n)})
    beta_rows = np.random.default_rng(0).permutation(n)
    [hit] = retriever._rerank(sp.csr_matrix([[1.0, 0.0]]),
                              [SearchHit([f"d{r}" for r in beta_rows], np.linspace(100, 61, n).tolist())])
    expected = sorted(range(n), key=lambda position: (-(beta_rows[position] % 4), position))
    assert hit.doc_ids == [f"d{beta_rows[p]}" for p in expected]
    assert hit.scores == [float(beta_rows[p] % 4) for p in expected]


# A random model's own tokens rank high in its vectors: a small top-k makes the lexical OR matter,
# a large one lets a query's few tokens meet the documents' kept dimensions (alpha)
TOPK = {"full": 3000, "alpha": 10000, "beta": 3000, "beta_rerank": 3000}


def mode_retriever(model_dir, search: str, rerank_depth: int = 3) -> SVDRRetriever:
    settings = SVDRSettings(search=search, topk=TOPK[search], rerank_depth=rerank_depth)
    handle = SparseEncoderHandle(model_dir, settings, LENGTHS)
    texts = passage_texts(CORPUS)
    return SVDRRetriever(CsrStore.build(handle.index_rows(texts), CORPUS["doc_id"].tolist()), handle,
                         dict(zip(CORPUS["doc_id"], texts)) if search == "beta_rerank" else None)


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
                              StubEncoder([[0.5, 0.0], [9, 9], [9, 9], [0.25, 0.5]]),
                              passages={"a": "0", "b": "1", "c": "2", "d": "3"})
    beta = SearchHit(["d", "a", "b", "c"], [10.0, 9, 8, 7])
    [hit] = retriever._rerank(sp.csr_matrix([[1.0, 1.0]]), [beta])
    assert hit.doc_ids == ["d", "a", "b", "c"]  # 0.75 before 0.5
    assert hit.scores == [0.75, 0.5, 8 - 8 + 0.5 - 1, 7 - 8 + 0.5 - 1]  # the tail shifted below the head
    [hit] = retriever._rerank(sp.csr_matrix([[1.0, -1.0]]), [beta])
    assert hit.doc_ids == ["a", "d", "b", "c"]  # 0.5 before -0.25


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
    save_retriever(updated, tmp_path / "whole")  # a whole copy first (a snapshot) leaves the delta whole too
    assert save_retriever_delta(updated, tmp_path / "delta")["delta"]
    assert CsrStore.load_files(tmp_path / "delta" / "index_delta").doc_ids == ["n1", "n2"]  # the new rows only
    replayed = load_chain([tmp_path / "base", tmp_path / "delta"], tiny_model_dir)
    assert replayed.live_ids() == updated.live_ids() == ["d0", "d1", "d3", "d4", "d5", "n1"]
    assert replayed.passages == updated.passages and (replayed.index.matrix != updated.index.matrix).nnz == 0
    assert replayed.search(QUERIES, 6) == updated.search(QUERIES, 6)
    assert replayed.search(["volcano lava magma"], 1)[0].doc_ids == ["n1"]  # re-ranked from its stored text
    with pytest.raises(ValueError, match="made from another version"):
        replayed.apply_delta(tmp_path / "delta", {})


def test_a_version_saved_before_passages_had_ids_loads_them_by_row(tiny_model_dir, tmp_path):
    """Registered versions hold passages one per index row, without ids (base and delta): loading
    them pairs each with its row's id, a document added again with its later, live row."""
    retriever = mode_retriever(tiny_model_dir, "beta_rerank")
    save_retriever(retriever, tmp_path / "base")
    texts = passage_texts(CORPUS)
    pd.DataFrame({"passage": texts}).to_parquet(tmp_path / "base" / "passages.parquet", index=False)  # the old form
    updated = load_retriever(tmp_path / "base", tiny_model_dir)
    assert updated.passages == dict(zip(CORPUS["doc_id"], texts))
    updated.remove(["d1"])
    again = pd.DataFrame({"doc_id": ["d1", "n1"], "title": ["again", "volcano"], "text": ["d1 rewritten", "lava"]})
    updated.add(again, UpdateContext(params=None, layout=None))
    save_retriever_delta(updated, tmp_path / "delta")
    new_texts = passage_texts(again)
    pd.DataFrame({"passage": new_texts}).to_parquet(tmp_path / "delta" / "passages_delta.parquet", index=False)
    replayed = load_chain([tmp_path / "base", tmp_path / "delta"], tiny_model_dir)
    assert replayed.passages == {**dict(zip(CORPUS["doc_id"], texts)), "d1": new_texts[0], "n1": new_texts[1]}
