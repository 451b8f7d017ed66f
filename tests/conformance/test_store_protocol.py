"""The index-store protocol (``model_code/stores/base.py``), run over every registered store (each
backend's dense and sparse stores, as ``model_code.stores`` registers them) and over a store defined
here, outside the project: search against brute force, additions, removals, stored vectors, copies,
whole saves and deltas; then the whole chain (index, evaluation, registration, a served model, an
update) on ``index.backend: numpy_test`` with no edit outside this file. A store registered in the
project gets these tests with no edit here."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from model_code.stores import (
    backends,
    exact_settings,
    load_store,
    register_store,
    store_class,
    unregister_store,
)
from model_code.stores.base import VectorStore, check_rows


class NumpyStore(VectorStore):
    """A dense store in plain NumPy: every row scored (what a user's own backend looks like)."""

    backend, shape = "numpy_test", "dense"

    def __init__(self, rows: np.ndarray, ids: list[str], live: np.ndarray):
        self.rows, self.ids, self.live = rows, ids, live
        self.loaded, self.removed = len(ids), []

    @classmethod
    def build(cls, vectors, doc_ids, settings=None):
        check_rows(len(vectors), doc_ids)
        return cls(np.asarray(vectors, dtype=np.float32).copy(), list(doc_ids), np.ones(len(doc_ids), dtype=bool))

    def add(self, vectors, doc_ids):
        check_rows(len(vectors), doc_ids)
        if set(doc_ids) & set(self.live_ids()):
            raise ValueError(f"documents already indexed: {sorted(set(doc_ids) & set(self.live_ids()))[:5]}")
        self.rows = np.vstack([self.rows, np.asarray(vectors, dtype=np.float32)])
        self.ids += list(doc_ids)
        self.live = np.concatenate([self.live, np.ones(len(doc_ids), dtype=bool)])

    def remove(self, doc_ids):
        if missing := set(doc_ids) - set(self.live_ids()):
            raise KeyError(f"documents not in the index: {sorted(missing)[:5]}")
        rows = [i for i, d in enumerate(self.ids) if d in set(doc_ids) and self.live[i]]
        self.live[rows] = False
        self.removed += [r for r in rows if r < self.loaded]
        return len(rows)

    def search(self, queries, k):
        scores = np.asarray(queries, dtype=np.float32) @ self.rows.T
        scores[:, ~self.live] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, : min(k, int(self.live.sum()))]
        return np.take_along_axis(scores, order, axis=1), [[self.ids[i] for i in row] for row in order]

    def vectors(self, doc_ids):
        row = {d: i for i, d in enumerate(self.ids) if self.live[i]}
        return self.rows[[row[d] for d in doc_ids]]

    def live_ids(self):
        return [d for d, alive in zip(self.ids, self.live) if alive]

    def copy(self):
        return NumpyStore(self.rows.copy(), list(self.ids), self.live.copy())

    def save_files(self, directory):
        directory.mkdir(parents=True, exist_ok=True)
        np.savez(directory / "rows.npz", rows=self.rows, live=self.live)
        (directory / "ids.json").write_text(json.dumps(self.ids))

    @classmethod
    def load_files(cls, directory):
        saved = np.load(Path(directory) / "rows.npz")
        return cls(saved["rows"], json.loads((Path(directory) / "ids.json").read_text()), saved["live"])

    def save_delta_files(self, directory):
        NumpyStore(self.rows[self.loaded:], self.ids[self.loaded:], self.live[self.loaded:]).save_files(directory)
        (directory / "delta.json").write_text(json.dumps({"first": self.loaded, "removed": self.removed}))

    def apply_delta_files(self, directory):
        delta, added = json.loads((directory / "delta.json").read_text()), NumpyStore.load_files(directory)
        assert delta["first"] == len(self.ids), "a delta of another version"
        self.rows, self.ids = np.vstack([self.rows, added.rows]), self.ids + added.ids
        self.live = np.concatenate([self.live, added.live])
        self.live[delta["removed"]] = False
        self.loaded, self.removed = len(self.ids), []


@pytest.fixture
def numpy_store():
    register_store(NumpyStore)
    yield NumpyStore
    unregister_store("numpy_test", "dense")


SHAPES = ("dense", "sparse")  # the shapes a kind asks a backend for (stores/base.py)


def registered_stores() -> list[tuple[str, str]]:
    """(backend, shape) of every store the project registers."""
    found = []
    for backend in backends():
        for shape in SHAPES:
            try:
                store_class(backend, shape)
            except ValueError:  # this backend has no store of that shape
                continue
            found.append((backend, shape))
    return found


STORES = [*registered_stores(), (NumpyStore.backend, NumpyStore.shape)]


def exact_store_settings(backend: str, tmp_path: Path):
    """``backend``'s settings for exact search, its service (if any) embedded under ``tmp_path``."""
    from model_code.config import IndexParams

    return store_class(backend, "dense").exact_settings(
        IndexParams(backend=backend, milvus={"uri": str(tmp_path / "milvus.db")}))


def rows(shape: str, n: int, seed: int):
    """Unit rows (dense) or non-negative sparse rows, as the kinds store them."""
    values = np.random.default_rng(seed).random((n, 12)).astype(np.float32)
    if shape == "sparse":
        return sp.csr_matrix(values * (values > 0.6))
    return values / np.linalg.norm(values, axis=1, keepdims=True)


def dense(x) -> np.ndarray:
    return x.toarray() if sp.issparse(x) else np.asarray(x)


def brute_force(vectors, ids: list[str], queries, k: int) -> list[list[str]]:
    """Top-k ids by inner product, ties by row: independent of every store."""
    scores = dense(queries) @ dense(vectors).T
    return [[ids[i] for i in np.argsort(-row, kind="stable")[:k]] for row in scores]


@pytest.mark.parametrize(("backend", "shape"), STORES)
def test_a_store_keeps_the_contract(tmp_path, numpy_store, backend, shape):
    cls = store_class(backend, shape)
    base, extra, queries = rows(shape, 40, 0), rows(shape, 5, 1), rows(shape, 6, 2)
    ids, new = [f"d{i}" for i in range(40)], [f"n{i}" for i in range(5)]
    store = cls.build(base, ids, exact_store_settings(backend, tmp_path))
    assert store.search(queries, 5)[1] == brute_force(base, ids, queries, 5)
    np.testing.assert_allclose(dense(store.vectors(["d3", "d7"])), dense(base)[[3, 7]], rtol=1e-6)

    store.save(tmp_path / "base")
    writer = load_store(tmp_path / "base")
    assert type(writer) is cls and writer.live_ids() == ids
    copy = writer.copy()
    writer.add(extra, new)
    with pytest.raises(ValueError, match="already indexed"):
        writer.add(extra[:1], ["d1"])
    for short in (extra[:2], extra[:4]):  # a vector short, or an id: refused, nothing written
        with pytest.raises(ValueError, match=f"{short.shape[0]} vectors for 3 document ids"):
            writer.add(short, ["m0", "m1", "m2"])
    with pytest.raises(ValueError, match="2 vectors for 3 document ids"):
        cls.build(base[:2], ["m0", "m1", "m2"], exact_store_settings(backend, tmp_path))
    assert writer.remove(["d1", "n2"]) == 2
    with pytest.raises(KeyError):
        writer.remove(["d1"])
    assert copy.live_ids() == ids  # the copy did not change with the writer
    keep = [i for i, d in enumerate(ids + new) if d not in ("d1", "n2")]
    everything, every_id = (sp.vstack([base, extra]) if shape == "sparse" else np.vstack([base, extra])), ids + new
    expected = brute_force(everything[keep], [every_id[i] for i in keep], queries, 8)
    assert writer.search(queries, 8)[1] == expected
    assert sorted(writer.live_ids()) == sorted(every_id[i] for i in keep)

    writer.save_delta(tmp_path / "delta")  # what changed since load, replayed on the version it came from
    replayed = load_store(tmp_path / "base")
    replayed.apply_delta(tmp_path / "delta")
    assert replayed.search(queries, 8)[1] == expected and sorted(replayed.live_ids()) == sorted(writer.live_ids())
    writer.save(tmp_path / "whole")
    assert load_store(tmp_path / "whole").search(queries, 50)[1] == writer.search(queries, 50)[1]


def test_exact_settings_search_every_row_in_process(numpy_store):
    from model_code.config import IndexParams

    exact = exact_settings(IndexParams(backend="numpy_test", factory="IVF4,Flat", nprobe=1))
    assert (exact.backend, exact.factory) == ("faiss", "Flat")


def test_an_unknown_backend_is_refused_by_name():
    from pydantic import ValidationError

    from model_code.config import IndexParams

    with pytest.raises(ValidationError, match=r"index.backend 'nope': not a registered store \(faiss"):
        IndexParams(backend="nope")


def test_a_store_defined_here_runs_the_chain(tmp_path, beir_dir, tiny_model_dir, mlflow_uri, numpy_store):
    """Index, evaluation and registration with ``index.backend: numpy_test``; the registered model
    loads and searches through it; an update adds a document to it as a delta."""
    import mlflow

    from model_code.config import load_params
    from model_code.versions.apply import upsert_documents
    from model_code.versions.chain import RetrieverVersions
    from tests.conftest import run_stages, tiny_params
    from tests.helpers.batches import write_batch
    from tracking.registry import register

    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                                                     index={"backend": "numpy_test"}),
                        "ingest", "train", "index", "evaluate")
    assert json.loads((layout.retriever / "index" / "store.json").read_text()) == {"backend": "numpy_test",
                                                                                  "shape": "dense"}
    metrics = json.loads((layout.root / "reports" / "eval" / "metrics.json").read_text())
    assert metrics["ndcg@10"] > 0.5  # the tiny corpus's titles are its queries
    params = load_params(layout.root / "params.yaml")
    assert register(params, layout, tracking_uri=mlflow_uri)["alias"] == "champion"
    mlflow.set_tracking_uri(mlflow_uri)
    served = mlflow.pyfunc.load_model(f"models:/{params.registry.model_name}@champion")
    assert isinstance(served.unwrap_python_model().retriever.index, NumpyStore)

    volcano = {"_id": "new-volcano", "title": "volcano", "text": "lava magma eruption crater ash plume"}
    upsert_documents(layout, params, write_batch(tmp_path / "batch.jsonl", [volcano]))
    versions = RetrieverVersions(layout)
    assert json.loads((versions.current_dir() / "manifest.json").read_text())["delta"] is True
    [hit] = versions.load().search(["volcano lava magma eruption"], 1)
    assert hit.doc_ids == ["new-volcano"]
