"""Kind ``mlr`` (multi-layer representations) against independent computations: layer vectors
from the transformer's hidden states pooled by hand, multi-vector search against a brute-force
max over layers, mean pooling against the averaged vectors, and additions and removals that move
all of a document's rows together; then the kind through the pipeline, registry and pyfunc."""

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from model_code.cli import main
from model_code.config import load_params
from model_code.data.ingested import load_ingested, passage_texts
from model_code.layout import Layout
from model_code.models.encoder import Encoder
from model_code.retrievers import load_retriever
from model_code.versions.chain import RetrieverVersions
from tests.conftest import run_stages, tiny_params
from tests.helpers.batches import write_batch
from tracking.registry import register

LAYERS = [2, 1, 0]  # the tiny BERT has 2 layers; 0 is the embedding layer


def mlr_workspace(tmp_path, beir_dir, tiny_model_dir, pooling: str):
    root = tmp_path / f"workspace-{pooling}"
    params = tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                         retriever={"kind": "mlr", "mlr": {"layers": LAYERS, "pooling": pooling}})
    run_stages(root, params, "ingest", "querygen", "cluster", "train", "index", "evaluate")
    return root


def hand_layer_vectors(model_dir, texts: list[str], max_length: int, pooling: str = "mean") -> np.ndarray:
    """(n, m, d): each listed hidden state pooled (the mean over the text's tokens, or its first,
    [CLS], state), unit length, with transformers alone (one text at a time: no padding to mask)."""
    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            states = model(**tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt"),
                           output_hidden_states=True).hidden_states
            vectors = np.stack([(states[layer][0].mean(0) if pooling == "mean" else states[layer][0, 0]).numpy()
                                for layer in LAYERS])
            out.append(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    return np.stack(out)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model_dir):
    from tests.conftest import write_beir

    tmp = tmp_path_factory.mktemp("mlr")
    beir = write_beir(tmp / "beir")
    return {pooling: mlr_workspace(tmp, beir, tiny_model_dir, pooling) for pooling in ("multi", "mean")}


def test_multi_vector_search_is_the_max_over_each_documents_layers(built, tiny_model_dir):
    root = built["multi"]
    params, layout = load_params(root / "params.yaml"), Layout(root)
    retriever = RetrieverVersions(layout).load()
    corpus = load_ingested(layout.ingested).corpus
    layers = hand_layer_vectors(tiny_model_dir, passage_texts(corpus), params.encoder.max_passage_length)
    assert retriever.index.index.ntotal == len(corpus) * len(LAYERS)  # N·m rows
    queries = ["stars planets telescope", "recipe oven flour", "football referee goal"]
    query_vectors = retriever.encoder.embed_queries(queries)
    for query, q, hit in zip(queries, query_vectors, retriever.search(queries, k=5)):
        best = np.einsum("nmd,d->nm", layers, q).max(axis=1)  # brute force: each document's best layer
        order = np.argsort(-best, kind="stable")[:5]
        assert hit.doc_ids == corpus["doc_id"].iloc[order].tolist(), query
        assert np.allclose(hit.scores, best[order], atol=1e-4)
        assert len(set(hit.doc_ids)) == len(hit.doc_ids)  # one hit per document


def test_index_row_r_is_layer_r_mod_m_of_document_r_div_m(built, tiny_model_dir):
    """The multi-vector index's rows against hidden states pooled by hand, row by row: a max or a
    mean over a document's layers cannot tell a permutation of its layers (e.g. each layer read one
    hidden state too early) from the right ones; the rows themselves can."""
    root = built["multi"]
    params, layout = load_params(root / "params.yaml"), Layout(root)
    retriever = RetrieverVersions(layout).load()
    corpus = load_ingested(layout.ingested).corpus
    hand = hand_layer_vectors(tiny_model_dir, passage_texts(corpus), params.encoder.max_passage_length)
    index = retriever.index.index
    rows = index.reconstruct_batch(np.arange(index.ntotal, dtype=np.int64))
    np.testing.assert_allclose(rows, hand.reshape(-1, hand.shape[-1]), atol=1e-4)
    assert retriever.index.doc_ids == [doc_id for doc_id in corpus["doc_id"] for _ in LAYERS]


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_layer_vectors_of_a_padded_batch_are_each_texts_own(tiny_model_dir, pooling):
    """Texts of three lengths encoded in one batch (the shorter ones padded) against each text
    alone: a mean that runs over padding, or a [CLS] vector read from another position, changes
    the shorter texts' vectors. The pipeline tests above only see texts cut to one length."""
    texts = ["short", "a somewhat longer text about the stars",
             "the longest of the three texts, about galaxies, telescopes, comets and their orbits"]
    encoder = Encoder(str(tiny_model_dir), pooling=pooling)
    lengths = encoder.tokenize(texts, 64)["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) == 3 and lengths.max() < 64  # padded, not cut
    np.testing.assert_allclose(encoder.encode(texts, 64, layers=LAYERS),
                               hand_layer_vectors(tiny_model_dir, texts, 64, pooling), atol=1e-5)


def test_mean_pooling_scores_the_average_of_the_layer_vectors(built, tiny_model_dir):
    root = built["mean"]
    params, layout = load_params(root / "params.yaml"), Layout(root)
    retriever = RetrieverVersions(layout).load()
    corpus = load_ingested(layout.ingested).corpus
    mean = hand_layer_vectors(tiny_model_dir, passage_texts(corpus), params.encoder.max_passage_length).mean(axis=1)
    assert retriever.index.index.ntotal == len(corpus)
    q = retriever.encoder.embed_queries(["music guitar chord"])[0]
    scores = mean @ q
    [hit] = retriever.search(["music guitar chord"], k=4)
    assert hit.doc_ids == corpus["doc_id"].iloc[np.argsort(-scores, kind="stable")[:4]].tolist()


def test_a_document_is_added_and_removed_with_all_its_rows(built, tmp_path, capsys):
    root = built["multi"]
    layout = Layout(root)
    before = RetrieverVersions(layout).load()
    rows = before.index.index.ntotal
    batch = write_batch(tmp_path / "new.jsonl", [{"_id": "volcano", "title": "volcano", "text": "lava magma crater"}])
    assert main(["add-documents", str(batch), "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    added = RetrieverVersions(layout).load()
    assert added.index.index.ntotal == rows + len(LAYERS) and "volcano" in added.live_ids()
    assert added.search(["volcano. lava magma crater"], k=1)[0].doc_ids == ["volcano"]
    assert main(["remove-documents", "volcano", "astronomy-0", "--params", str(root / "params.yaml"),
                 "--root", str(root)]) == 0
    removed = RetrieverVersions(layout).load()
    assert removed.index.index.ntotal == rows - len(LAYERS)  # every row of both documents
    assert not {"volcano", "astronomy-0"} & set(removed.live_ids())
    hits = removed.search(["astronomy stars planets galaxies telescope"], k=len(removed.live_ids()))[0]
    assert "astronomy-0" not in hits.doc_ids and len(hits.doc_ids) == len(removed.live_ids())


def test_layers_must_start_at_the_encoders_last_layer(tmp_path, beir_dir, tiny_model_dir):
    root = tmp_path / "ws"
    params = tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                         retriever={"kind": "mlr", "mlr": {"layers": [1, 0]}})
    run_stages(root, params, "ingest", "querygen", "cluster")
    assert main(["train", "--params", str(root / "params.yaml"), "--root", str(root)]) != 0  # before it trains
    with pytest.raises(ValueError, match="last layer first"):
        load_params(root / "params.yaml", {"retriever": {"mlr": {"layers": [0, 2]}}})


def test_an_mlr_retriever_is_registered_and_served(built, mlflow_uri):
    root = built["mean"]
    uri = mlflow_uri
    result = register(load_params(root / "params.yaml"), Layout(root), tracking_uri=uri)
    assert result["retriever"] == "mlr"
    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(result["model_uri"])
    answer = served.predict(["recipe oven flour butter"], params={"k": 3})
    direct = load_retriever(Layout(root).retriever, Layout(root).encoder).search(["recipe oven flour butter"], 3)[0]
    assert answer["doc_ids"][0] == direct.doc_ids
    assert json.loads((Layout(root).retriever / "manifest.json").read_text())["mlr"]["pooling"] == "mean"
    assert isinstance(answer, pd.DataFrame)
