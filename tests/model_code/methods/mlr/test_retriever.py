"""Kind ``mlr`` (``model_code/methods/mlr/retriever.py``) on a tiny example, fast: an encoder stand-in
returns hand-made unit layer vectors, so the index rows, the multi-vector search (against a
brute-force max over each document's layers), mean and scalar-mix pooling (against the averaged and
weighted vectors), self-contrastive's last-layer index, additions, removals, persistence, deltas
and the settings' rules are checked without a model.
(The layer vectors themselves against transformers' hidden states, and the kind through the
pipeline, registry and pyfunc: ``test_kind.py``.)"""

import json
from pathlib import Path
from types import SimpleNamespace

import faiss
import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from model_code.config import IndexParams
from model_code.methods.mlr import retriever as mlr
from model_code.methods.mlr.retriever import (
    MLRRetriever,
    MLRSettings,
    document_vectors,
    indexed_layers,
    row_ids,
    rows_per_document,
)
from model_code.stores.faiss_store import FaissStore

LAYERS = [3, 1, 0]  # the stand-in encoder has 3 layers; 0 is the embedding layer
D = 4
MIX = np.array([0.5, 0.3, 0.2], dtype=np.float32)  # scalar-mix weights of LAYERS
POOLINGS = ["multi", "mean", "scalar_mix", "self_contrastive"]


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


class LayerTable:
    """An EncoderHandle stand-in: each document has a unit vector at each of layers 0..3 (a table),
    each query one vector; records what it was asked to encode."""

    def __init__(self, doc_ids: list[str], queries: dict[str, np.ndarray], seed: int = 0):
        rng = np.random.default_rng(seed)
        self.table = {d: unit(rng.normal(size=(4, D))).astype(np.float32) for d in doc_ids}
        self.queries = queries
        self.model = SimpleNamespace(num_layers=3)
        self.calls: list[tuple] = []

    def embed_document_layers(self, documents: pd.DataFrame, layers: list[int], desc: str | None = None) -> np.ndarray:
        self.calls.append(("layers", documents["doc_id"].tolist(), list(layers), desc))
        return np.stack([self.table[d][layers] for d in documents["doc_id"]])

    def embed_queries(self, texts: list[str], desc: str | None = None) -> np.ndarray:
        self.calls.append(("queries", list(texts), desc))
        return np.stack([self.queries[t] for t in texts]).astype(np.float32)

    def manifest(self) -> dict:
        return {"encoder": {"pooling": "mean", "max_query_length": 5, "max_passage_length": 7, "batch_size": 2,
                            "shared_encoder": True}}


def corpus(ids: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"doc_id": ids, "title": ids, "text": [f"text of {d}" for d in ids]})


def retriever(ids: list[str], pooling: str, queries: dict[str, np.ndarray], seed: int = 0) -> MLRRetriever:
    settings = MLRSettings(layers=LAYERS, pooling=pooling)
    encoder = LayerTable(ids, queries, seed)
    weights = MIX if pooling == "scalar_mix" else None
    vectors = document_vectors(encoder, settings, corpus(ids), weights)
    return MLRRetriever(FaissStore.build(vectors, row_ids(settings, ids)), encoder, settings, {"factory": "Flat"},
                        weights)


def score_by_hand(encoder: LayerTable, d: str, q: np.ndarray, pooling: str) -> float:
    """A document's score: its best layer's inner product (multi), the averaged (mean) or
    MIX-weighted (scalar_mix) layer vectors', or the last layer's (self_contrastive)."""
    q = q.astype(np.float64)
    per_layer = [float(np.dot(q, v.astype(np.float64))) for v in encoder.table[d][LAYERS]]
    if pooling == "multi":
        return max(per_layer)
    if pooling == "mean":
        return sum(per_layer) / len(per_layer)
    if pooling == "scalar_mix":
        return sum(float(w) * s for w, s in zip(MIX, per_layer))
    return per_layer[0]


def brute_force(encoder: LayerTable, ids: list[str], q: np.ndarray, k: int, pooling: str):
    score = {d: score_by_hand(encoder, d, q, pooling) for d in ids}
    ranked = sorted(ids, key=lambda d: -score[d])[:k]
    return ranked, [score[d] for d in ranked]


def test_settings_are_distinct_layers_last_first():
    assert MLRSettings().layers == [6, 4] and MLRSettings().pooling == "multi"
    assert MLRSettings(layers=[2, 1, 0]).layers == [2, 1, 0]  # the embedding layer is a layer
    assert MLRSettings(layers=[5]).layers == [5]
    for wrong in ([], [4, 6], [6, 6], [6, 4, 4], [3, -1]):
        with pytest.raises(ValidationError) as error:
            MLRSettings(layers=wrong)
        assert (f"retriever.mlr.layers must be distinct layer numbers, last layer first; got {wrong}"
                in str(error.value)), wrong
    with pytest.raises(ValidationError):
        MLRSettings(pooling="max")
    assert MLRSettings().reg_weight == 1.0 and MLRSettings().mix_learning_rate is None
    assert MLRSettings(reg_weight=0.0).reg_weight == 0.0 and MLRSettings(mix_learning_rate=1e-3).mix_learning_rate == 1e-3
    for wrong in ({"reg_weight": -0.1}, {"mix_learning_rate": 0.0}):
        with pytest.raises(ValidationError):
            MLRSettings(**wrong)
    with pytest.raises(ValidationError):
        MLRSettings(layer=[6])  # unknown keys are errors
    with pytest.raises(ValidationError):
        MLRSettings().layers = [6]  # frozen


def test_rows_are_document_major_one_per_layer_for_multi_one_otherwise():
    multi, mean = MLRSettings(layers=LAYERS), MLRSettings(layers=LAYERS, pooling="mean")
    assert [rows_per_document(MLRSettings(layers=LAYERS, pooling=p)) for p in POOLINGS] == [3, 1, 1, 1]
    assert [indexed_layers(MLRSettings(layers=LAYERS, pooling=p)) for p in POOLINGS] == [LAYERS, LAYERS, LAYERS, [3]]
    assert row_ids(multi, ["a", "b"]) == ["a", "a", "a", "b", "b", "b"]
    assert row_ids(mean, ["a", "b"]) == ["a", "b"]
    encoder = LayerTable(["a", "b"], {})
    rows = document_vectors(encoder, multi, corpus(["a", "b"]), desc="encoding")
    assert rows.shape == (6, D)
    assert np.array_equal(rows, np.concatenate([encoder.table["a"][[3, 1, 0]], encoder.table["b"][[3, 1, 0]]]))
    averaged = document_vectors(encoder, mean, corpus(["a", "b"]))
    assert averaged.shape == (2, D)
    for row, d in zip(averaged, ["a", "b"]):
        assert np.allclose(row, (encoder.table[d][3] + encoder.table[d][1] + encoder.table[d][0]) / 3, atol=1e-7)
    mixed = document_vectors(encoder, MLRSettings(layers=LAYERS, pooling="scalar_mix"), corpus(["a", "b"]), MIX)
    for row, d in zip(mixed, ["a", "b"]):
        assert np.allclose(row, 0.5 * encoder.table[d][3] + 0.3 * encoder.table[d][1] + 0.2 * encoder.table[d][0],
                           atol=1e-7)
    last = document_vectors(encoder, MLRSettings(layers=LAYERS, pooling="self_contrastive"), corpus(["a", "b"]))
    assert np.array_equal(last, np.stack([encoder.table["a"][3], encoder.table["b"][3]]))
    assert encoder.calls == [("layers", ["a", "b"], LAYERS, "encoding"), ("layers", ["a", "b"], LAYERS, None),
                             ("layers", ["a", "b"], LAYERS, None), ("layers", ["a", "b"], [3], None)]


def test_a_layer_list_not_starting_at_the_last_layer_fails_before_encoding():
    encoder = LayerTable(["a"], {})
    for pooling in POOLINGS:
        with pytest.raises(ValueError) as error:
            document_vectors(encoder, MLRSettings(layers=[2, 1], pooling=pooling), corpus(["a"]), MIX[:2])
        assert str(error.value) == ("retriever.mlr.layers starts with layer 2, but the encoder's last layer is 3: "
                                    "list the last layer first")
    assert encoder.calls == []


def test_multi_vector_search_is_the_max_over_each_documents_layers():
    ids = [f"d{i}" for i in range(7)]
    rng = np.random.default_rng(1)
    queries = {f"q{i}": unit(rng.normal(size=D)).astype(np.float32) for i in range(12)}
    r = retriever(ids, "multi", queries)
    assert len(r.index) == 7 * 3
    for k in (1, 3, 7):
        hits = r.search(list(queries), k, desc="queries")
        for text, hit in zip(queries, hits):
            want_ids, want_scores = brute_force(r.encoder, ids, queries[text], k, "multi")
            assert hit.doc_ids == want_ids, (text, k)
            assert hit.scores == pytest.approx(want_scores, abs=1e-5)
    assert r.encoder.calls[-1] == ("queries", list(queries), "queries")


def test_a_document_whose_layers_fill_the_top_rows_counts_once():
    """Document a's three layer vectors are the three best rows for the query: a search for k = 2
    must still return two documents, a (its best layer) then the best of the others."""
    q = np.array([1.0, 0, 0, 0], dtype=np.float32)
    r = retriever(["a", "b", "c"], "multi", {"q": q})
    r.encoder.table["a"][[3, 1, 0]] = unit(np.array([[1.0, 0.1, 0, 0], [1.0, 0.2, 0, 0], [1.0, 0.05, 0, 0]]))
    r.encoder.table["b"][[3, 1, 0]] = unit(np.array([[0.0, 1, 0, 0], [0.5, 1, 0, 0], [0.0, 0, 1, 0]]))
    r.encoder.table["c"][[3, 1, 0]] = unit(np.array([[0.2, 1, 0, 0], [0.0, 0, 0, 1], [0.0, 1, 1, 0]]))
    settings = r.settings
    r.index = FaissStore.build(document_vectors(r.encoder, settings, corpus(["a", "b", "c"])),
                             row_ids(settings, ["a", "b", "c"]))
    [hit] = r.search(["q"], 2)
    want_ids, want_scores = brute_force(r.encoder, ["a", "b", "c"], q, 2, "multi")
    assert want_ids == ["a", "b"] and hit.doc_ids == want_ids
    assert hit.scores == pytest.approx(want_scores, abs=1e-6)
    [everything] = r.search(["q"], 5)  # more than the corpus: each document once, not padded
    assert everything.doc_ids == brute_force(r.encoder, ["a", "b", "c"], q, 3, "multi")[0]


@pytest.mark.parametrize("pooling", ["mean", "scalar_mix", "self_contrastive"])
def test_one_vector_poolings_score_their_pooled_vector(pooling):
    ids = [f"d{i}" for i in range(6)]
    rng = np.random.default_rng(2)
    queries = {f"q{i}": unit(rng.normal(size=D)).astype(np.float32) for i in range(8)}
    r = retriever(ids, pooling, queries, seed=3)
    assert len(r.index) == 6
    for text, hit in zip(queries, r.search(list(queries), 4)):
        want_ids, want_scores = brute_force(r.encoder, ids, queries[text], 4, pooling)
        assert hit.doc_ids == want_ids and hit.scores == pytest.approx(want_scores, abs=1e-5)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_additions_and_removals_move_all_of_a_documents_rows(pooling):
    ids = ["a", "b", "c"]
    rng = np.random.default_rng(4)
    queries = {f"q{i}": unit(rng.normal(size=D)).astype(np.float32) for i in range(6)}
    r = retriever(ids, pooling, queries)
    m = 3 if pooling == "multi" else 1
    r.encoder.table.update(LayerTable(["x", "y"], {}, seed=9).table)
    report = r.add(corpus(["x", "y"]), context=None)
    assert set(report) == {"encode_ms_per_doc", "add_ms_per_doc"}
    assert all(isinstance(v, float) and v >= 0 for v in report.values())
    assert len(r.index) == 5 * m and r.live_ids() == ["a", "b", "c", "x", "y"]
    for text, hit in zip(queries, r.search(list(queries), 5)):
        assert hit.doc_ids == brute_force(r.encoder, ["a", "b", "c", "x", "y"], queries[text], 5, pooling)[0]
    assert r.remove(["b", "x", "b"]) == 2  # distinct documents, each with all its rows
    assert len(r.index) == 3 * m and r.live_ids() == ["a", "c", "y"]
    for text, hit in zip(queries, r.search(list(queries), 5)):
        assert hit.doc_ids == brute_force(r.encoder, ["a", "c", "y"], queries[text], 5, pooling)[0]


def built_retriever(tmp_path, monkeypatch, pooling: str, ids: list[str], factory: str = "IVF2,Flat"):
    """MLRRetriever.build on stand-ins for params, data and layout (and, for scalar_mix, MIX saved
    as the train stage saves it beside the encoder)."""
    settings = MLRSettings(layers=LAYERS, pooling=pooling)
    encoder, made = LayerTable(ids, {"q": unit(np.ones(D)).astype(np.float32)}), []

    def from_params(directory, params, cache=None):
        made.append((directory, params, cache))
        return encoder

    monkeypatch.setattr(mlr.EncoderHandle, "from_params", from_params)
    (tmp_path / "enc").mkdir(exist_ok=True)
    (tmp_path / "enc" / "scalar_mix.json").write_text(json.dumps({"layers": LAYERS, "weights": MIX.tolist()}))
    encoder_params = object()
    params = SimpleNamespace(retriever=SimpleNamespace(settings={"mlr": settings}.__getitem__), encoder=encoder_params,
                             index=IndexParams(factory=factory, nprobe=2, use_gpu="never"))
    layout = SimpleNamespace(encoder=tmp_path / "enc", embedding_cache=tmp_path / "cache")
    built = MLRRetriever.build(params, SimpleNamespace(corpus=corpus(ids)), layout)
    assert made == [(tmp_path / "enc", encoder_params, tmp_path / "cache")]  # a build reads and stores through it
    assert built.encoder is encoder and built.settings == settings
    return built


@pytest.mark.parametrize("pooling", ["multi", "scalar_mix"])
def test_build_save_and_load(tmp_path, monkeypatch, pooling):
    """build: the settings of kind mlr, the encoder of the layout (and its scalar-mix weights), the
    index settings of params; save_files/load_files: the same index, settings, weights and facts."""
    ids = [f"d{i}" for i in range(8)]
    built = built_retriever(tmp_path, monkeypatch, pooling, ids)
    encoder, rows = built.encoder, 24 if pooling == "multi" else 8
    assert encoder.calls == [("layers", ids, LAYERS, "encoding corpus layers")]
    assert {k: built.info[k] for k in ("factory", "dimension", "rows")} == {"factory": "IVF2,Flat", "dimension": D,
                                                                           "rows": rows}
    assert built.info["encode_seconds"] >= 0 and built.info["build_seconds"] >= 0
    assert built.index.doc_ids == row_ids(built.settings, ids) and built.index.use_gpu == "never"
    if pooling == "scalar_mix":
        assert built.weights.tolist() == MIX.tolist()
    else:
        assert built.weights is None
    assert faiss.extract_index_ivf(built.index.index).nprobe == 2  # both lists: the search is exact
    [hit] = built.search(["q"], 3)
    assert hit.doc_ids == brute_force(encoder, ids, encoder.queries["q"], 3, pooling)[0]

    manifest = built.save_files(tmp_path / "saved")
    weights = {"mlr_weights": MIX.tolist()} if pooling == "scalar_mix" else {}
    assert manifest == {**built.info, **encoder.manifest(), "mlr": built.settings.model_dump(), **weights}
    assert manifest["mlr"]["layers"] == LAYERS and manifest["mlr"]["pooling"] == pooling
    loaded = MLRRetriever.load_files(tmp_path / "saved", manifest, tmp_path / "enc")
    assert loaded.settings == built.settings and loaded.info == {"factory": "IVF2,Flat", "dimension": D, "rows": rows}
    if pooling == "scalar_mix":
        assert loaded.weights.dtype == np.float32 and loaded.weights.tolist() == MIX.tolist()
    else:
        assert loaded.weights is None
    assert loaded.index.doc_ids == built.index.doc_ids and len(loaded.index) == rows
    assert loaded.encoder.directory == Path(tmp_path / "enc") and loaded.encoder.manifest() == encoder.manifest()
    bare = MLRRetriever.load_files(tmp_path / "saved", {k: manifest[k] for k in ("encoder", "mlr")}, tmp_path / "enc")
    assert bare.info == {} and bare.weights is None
    assert MLRRetriever(built.index, encoder, built.settings).info == {}


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_delta_replays_additions_and_removals_on_the_saved_version(tmp_path, monkeypatch, pooling):
    ids = [f"d{i}" for i in range(6)]
    built = built_retriever(tmp_path, monkeypatch, pooling, ids)  # IVF: removals keep every other row's id
    manifest = built.save_files(tmp_path / "v1")
    changed = MLRRetriever.load_files(tmp_path / "v1", manifest, tmp_path / "enc")
    changed.encoder = built.encoder
    built.encoder.table.update(LayerTable(["x"], {}, seed=5).table)
    changed.add(corpus(["x"]), context=None)
    changed.remove(["d2"])
    assert changed.save_delta(tmp_path / "v2") == {}
    replayed = MLRRetriever.load_files(tmp_path / "v1", manifest, tmp_path / "enc")
    replayed.apply_delta(tmp_path / "v2", {})
    replayed.encoder = built.encoder
    assert replayed.index.doc_ids == changed.index.doc_ids and len(replayed.index) == len(changed.index)
    live = [d for d in ids if d != "d2"] + ["x"]
    assert replayed.live_ids() == live
    [hit] = replayed.search(["q"], 7)
    assert hit.doc_ids == brute_force(built.encoder, live, built.encoder.queries["q"], 7, pooling)[0]


class ScriptedClock:
    """time.perf_counter for the mlr module: each call returns the next of the given instants."""

    def __init__(self, *instants: float):
        self.instants = list(instants)

    def perf_counter(self) -> float:
        return self.instants.pop(0)


def test_reported_timings_come_from_the_clock_around_each_step(tmp_path, monkeypatch):
    """With a scripted clock (not a timed assertion): build reports encoding and index-building
    seconds, add the milliseconds per added document of each step."""
    ids = [f"d{i}" for i in range(4)]
    monkeypatch.setattr(mlr, "time", ScriptedClock(100.0, 102.5, 103.25))
    built = built_retriever(tmp_path, monkeypatch, "multi", ids, factory="Flat")
    assert (built.info["encode_seconds"], built.info["build_seconds"]) == (2.5, 0.75)
    built.encoder.table.update(LayerTable(["x", "y"], {}, seed=5).table)
    monkeypatch.setattr(mlr, "time", ScriptedClock(200.0, 200.5, 201.25))
    report = built.add(corpus(["x", "y"]), context=None)
    assert report == {"encode_ms_per_doc": 1000 * 0.5 / 2, "add_ms_per_doc": 1000 * 0.75 / 2}
