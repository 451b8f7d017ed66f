"""Incremental versions stored as deltas: what an update changed, replayed onto the version it
was made from, gives exactly the retriever the update produced in memory; every
``freshness.full_copy_every``-th version is stored whole; a delta never loads on the wrong base."""

import json

import numpy as np
import pytest
import torch

from model_code.config import load_params
from model_code.layout import Layout
from model_code.methods.incdsi.head import AdditionParams, IncDSIHead
from model_code.retrievers import load_retriever
from model_code.stores.faiss_store import FaissStore
from model_code.versions.apply import add_documents, edit_documents, remove_documents
from model_code.versions.chain import RetrieverVersions
from tests.conftest import run_stages, tiny_params


def unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_an_index_delta_replays_adds_and_removes_onto_its_base(tmp_path):
    base_vectors, new_vectors = unit_rows(5, 8, 0), unit_rows(3, 8, 1)
    FaissStore.build(base_vectors, [f"b{i}" for i in range(5)]).save(tmp_path / "base")
    writer = FaissStore.load_files(tmp_path / "base")
    writer.add(new_vectors, ["n0", "n1", "n2"])
    writer.remove(["b1", "n1"])  # a base row, and a row added by this same update
    writer.save_delta(tmp_path / "delta")

    replayed = FaissStore.load_files(tmp_path / "base")
    replayed.apply_delta(tmp_path / "delta")
    assert replayed.doc_ids == ["b0", None, "b2", "b3", "b4", "n0", None, "n2"]  # positions as the writer's
    assert len(replayed) == 6
    # brute force over the documents that should be there
    expected = {"b0": base_vectors[0], "b2": base_vectors[2], "b3": base_vectors[3], "b4": base_vectors[4],
                "n0": new_vectors[0], "n2": new_vectors[2]}
    queries = unit_rows(4, 8, 2)
    scores, ids = replayed.search(queries, 6)
    for query, row_scores, row_ids in zip(queries, scores, ids):
        brute = sorted(expected, key=lambda d: -float(expected[d] @ query))
        assert row_ids == brute
        np.testing.assert_allclose(row_scores, [expected[d] @ query for d in brute], rtol=1e-5)
    # the delta holds the two live new vectors only, not the index
    assert np.load(tmp_path / "delta" / "added_vectors.npy").shape == (2, 8)

    replayed.add(unit_rows(1, 8, 3), ["n3"])  # a replayed index journals only what comes after it
    replayed.save_delta(tmp_path / "delta2")
    assert json.loads((tmp_path / "delta2" / "delta.json").read_text()) == {
        "first_row": 8, "doc_ids": ["n3"], "removed_rows": []}

    with pytest.raises(ValueError, match="made from another version"):  # applied twice = on the wrong base
        replayed.apply_delta(tmp_path / "delta")


def test_a_head_delta_gives_the_head_a_whole_copy_gives(tmp_path):
    rng = torch.Generator().manual_seed(0)
    head = IncDSIHead(torch.randn(6, 8, generator=rng), torch.randn(6, 8, generator=rng), [f"d{i}" for i in range(6)])
    head.save(tmp_path / "base")
    writer = IncDSIHead.load(tmp_path / "base")
    params = AdditionParams(max_steps=5)
    writer.add("n0", torch.randn(3, 8, generator=rng), params)
    writer.remove("d2")  # a loaded row
    writer.add("n1", torch.randn(3, 8, generator=rng), params)
    writer.edit("d4", torch.randn(3, 8, generator=rng), params)  # loaded row, deleted then appended
    writer.remove("n0")  # added and removed within the update
    writer.save(tmp_path / "whole")
    writer.save_delta(tmp_path / "delta")

    replayed = IncDSIHead.load(tmp_path / "base").apply_delta(tmp_path / "delta")
    whole = IncDSIHead.load(tmp_path / "whole")
    assert replayed.doc_ids == whole.doc_ids == ["d0", "d1", "d3", "d5", "n1", "d4"]
    for name in ("weights", "rep_queries", "own_logits"):
        assert torch.equal(getattr(replayed, name), getattr(whole, name)), name
    delta = json.loads((tmp_path / "delta" / "delta.json").read_text())
    assert (sorted(delta["dropped"]), delta["doc_ids"]) == (["d2", "d4"], ["n1", "d4"])
    with pytest.raises(ValueError, match="made from another version"):
        replayed.apply_delta(tmp_path / "delta")


def write_batch(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory, tiny_model_dir):
    """One built tiny workspace per kind (untrained encoder: deltas do not depend on training)."""
    from tests.conftest import write_beir

    built = {}
    beir = write_beir(tmp_path_factory.mktemp("beir"))
    for kind, settings in [("dense", {}), ("mlr", {"mlr": {"layers": [2, 1], "pooling": "multi"}}),
                           ("incdsi", {"incdsi": {"tune_trials": 0, "tune_share": 0.2, "head_epochs": 2}})]:
        root = tmp_path_factory.mktemp(kind)
        params = tiny_params(beir, tiny_model_dir, train={"enabled": False}, retriever={"kind": kind, **settings},
                             freshness={"full_copy_every": 3})
        run_stages(root, params, "ingest", "querygen", "cluster", "train", "index")
        built[kind] = root
    return built


QUERIES = ["lava magma eruption", "comet orbit telescope", "sourdough butter oven", "astronomy planets"]


@pytest.mark.parametrize("kind", ["dense", "mlr", "incdsi"])
def test_versions_are_deltas_until_every_nth_is_whole_and_each_loads_as_written(workspaces, tmp_path, kind,
                                                                                  monkeypatch):
    root = workspaces[kind]
    layout, params = Layout(root), load_params(root / "params.yaml")
    versions = RetrieverVersions(layout)
    in_memory = {}  # what each update produced before it was saved: the independent reference

    cls = type(versions.load())
    original = cls.save_delta

    def remember(self, directory):
        hits = self.search(QUERIES, 5)
        in_memory[directory.name] = ([h.doc_ids for h in hits], [h.scores for h in hits], sorted(self.live_ids()))
        return original(self, directory)
    monkeypatch.setattr(cls, "save_delta", remember)

    volcano = {"_id": "new-volcano", "title": "volcano", "text": "lava magma eruption crater ash plume"}
    add_documents(layout, params, write_batch(tmp_path / "a.jsonl", [volcano]))  # v0001: delta of base
    first = versions.load().live_ids()[0]
    edit_documents(layout, params, write_batch(tmp_path / "e.jsonl", [{"_id": first, "title": "t",
                                                                       "text": "comet orbit telescope night"}]))
    remove_documents(layout, params, ["new-volcano"])  # v0003: the third in the chain is whole
    add_documents(layout, params, write_batch(tmp_path / "b.jsonl", [{**volcano, "_id": "volcano-2"}]))

    manifests = {v: json.loads((versions.root / v / "manifest.json").read_text()) for v in
                 ("v0001", "v0002", "v0003", "v0004")}
    assert [bool(m.get("delta")) for m in manifests.values()] == [True, True, False, True]
    assert [m.get("delta_of") for m in manifests.values()] == ["base", "v0001", None, "v0003"]
    assert versions.chain("v0002") == [layout.retriever, versions.root / "v0001", versions.root / "v0002"]
    assert versions.chain("v0004") == [versions.root / "v0003", versions.root / "v0004"]
    assert not any((versions.root / "v0001").rglob("index.faiss"))  # no copy of the index in a delta

    for name in ("v0001", "v0002", "v0004"):  # each delta, loaded through its chain, is what was written
        loaded = versions.load_version(name)
        hits = loaded.search(QUERIES, 5)
        ids, scores, live = in_memory[name]
        assert [h.doc_ids for h in hits] == ids and sorted(loaded.live_ids()) == live
        np.testing.assert_allclose([h.scores for h in hits], scores, rtol=1e-6)
    assert "new-volcano" in versions.load_version("v0002").live_ids()
    assert "new-volcano" not in versions.load_version("v0003").live_ids()
    assert "volcano-2" in versions.load_version("v0004").live_ids()
    with pytest.raises(ValueError, match="holds only the changes made to version base"):
        load_retriever(versions.root / "v0001", layout.encoder)
