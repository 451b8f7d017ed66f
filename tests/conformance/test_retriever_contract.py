"""The retriever contract (``model_code/retrievers/base.py``), run over every registered kind and
over a kind defined here, outside the project (``overlap``): a kind builds on the tiny corpus,
searches (one hit list per query, best first, the same hits for a query alone as in a batch),
saves and loads as it searched, and takes additions, edits and removals as versions, each of which
(stored whole or as a delta replayed onto its chain) loads as the update left it in memory and as
that retriever saved whole. A kind registered in the project gets these tests with no edit here.
Then ``overlap`` runs through index -> evaluate -> register -> serve -> add-documents without
touching any project module."""

import json
import re
import shutil
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest
from pydantic import BaseModel

from model_code.config import load_params
from model_code.data.ingested import load_ingested, passage_texts
from model_code.layout import Layout
from model_code.retrievers import (
    Retriever,
    SearchHit,
    kind_class,
    kind_names,
    load_retriever,
    register,
    save_retriever,
)
from model_code.retrievers.registry import unregister
from model_code.versions.apply import add_documents, edit_documents, remove_documents
from model_code.versions.chain import RetrieverVersions
from tests.conftest import cli, run_stages, tiny_params, workspace_for, write_beir
from tests.helpers.batches import write_batch
from tracking.registry import register as register_model

WORDS = re.compile(r"\w\w+")


def words(text: str) -> set[str]:
    return set(WORDS.findall(text.lower()))


class OverlapSettings(BaseModel):
    min_overlap: int = 1  # documents sharing fewer words with the query are not returned


class OverlapRetriever(Retriever):
    """Ranks documents by how many distinct words they share with the query (ties by id)."""

    kind = "overlap"
    settings_model = OverlapSettings
    uses_encoder = False

    def __init__(self, documents: dict[str, str], settings: OverlapSettings):
        self.documents, self.settings = documents, settings

    @classmethod
    def build(cls, params, data, layout):
        return cls(dict(zip(data.corpus["doc_id"], passage_texts(data.corpus))), params.retriever.settings())

    def save_files(self, directory: Path) -> dict[str, Any]:
        (directory / "documents.json").write_text(json.dumps(self.documents))
        return {"settings": self.settings.model_dump()}

    @classmethod
    def load_files(cls, directory, manifest, encoder_dir):
        return cls(json.loads((directory / "documents.json").read_text()), OverlapSettings(**manifest["settings"]))

    def search(self, queries, k, desc=None):
        results = []
        for query in queries:
            scored = sorted(((len(words(query) & words(text)), doc_id) for doc_id, text in self.documents.items()),
                            key=lambda pair: (-pair[0], pair[1]))
            kept = [(s, d) for s, d in scored if s >= self.settings.min_overlap][:k]
            results.append(SearchHit([d for _, d in kept], [float(s) for s, _ in kept]))
        return results

    def live_ids(self):
        return list(self.documents)

    def add(self, documents: pd.DataFrame, context) -> dict[str, Any]:
        self.documents.update(zip(documents["doc_id"], passage_texts(documents)))
        return {"added_here": len(documents)}

    def remove(self, doc_ids):
        for doc_id in doc_ids:
            del self.documents[doc_id]
        return len(doc_ids)


@pytest.fixture(autouse=True, scope="module")
def overlap_kind():
    """The kind exists while this module's tests run, as a user's plugin would register it."""
    register(OverlapRetriever)
    yield
    unregister("overlap")


def test_a_kind_registered_outside_the_project_runs_the_whole_chain(tmp_path, beir_dir, tiny_model_dir, mlflow_uri):
    assert "overlap" in kind_names() and kind_class("overlap") is OverlapRetriever
    root = workspace_for(tmp_path, beir_dir, tiny_model_dir, {"kind": "overlap", "overlap": {"min_overlap": 2}})
    assert load_params(root / "params.yaml").retriever.settings() == OverlapSettings(min_overlap=2)
    assert cli(root, "all") == 0
    layout = Layout(root)
    manifest = json.loads((layout.retriever / "manifest.json").read_text())
    assert (manifest["kind"], manifest["files"], manifest["documents"]) == ("overlap", ["document_store.parquet", "documents.json"], 48)
    assert json.loads((layout.encoder / "not_used.json").read_text())["used"] is False  # no encoder trained

    # evaluation kept the kind's top 10 by its rule, recomputed here from the raw BEIR files, and the run
    # file ranks them as trec_eval does: score descending, tied scores by document id descending
    corpus = {row["_id"]: f"{row['title']} {row['text']}" for row in map(json.loads, (beir_dir / "corpus.jsonl").open())}
    queries = {row["_id"]: row["text"] for row in map(json.loads, (beir_dir / "queries.jsonl").open())}
    run = pd.read_csv(layout.eval_report / "run.trec", sep=" ", names=["q", "Q0", "doc", "rank", "score", "tag"])
    for query_id, ranked in run.groupby("q"):
        overlap = {doc: len(words(queries[query_id]) & words(text)) for doc, text in corpus.items()}
        top = sorted((d for d, s in overlap.items() if s >= 2), key=lambda d: (-overlap[d], d))[:10]
        assert ranked.sort_values("rank")["doc"].tolist() == sorted(top, key=lambda d: (overlap[d], d), reverse=True)
    metrics = json.loads((layout.eval_report / "metrics.json").read_text())
    assert metrics["retriever"] == "overlap" and metrics["queries"] == 12

    uri = mlflow_uri
    assert register_model(load_params(root / "params.yaml"), layout, tracking_uri=uri)["alias"] == "champion"
    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model("models:/test-retriever@champion")
    answer = served.predict(["music melody chord guitar"], params={"k": 2})
    assert answer["doc_ids"][0][0].startswith("music-")

    batch = write_batch(tmp_path / "new.jsonl", [{"_id": "volcano-1", "title": "volcano", "text": "lava magma crater"}])
    assert cli(root, "add-documents", str(batch)) == 0
    version = RetrieverVersions(layout).current_dir()
    assert json.loads((version / "manifest.json").read_text())["added_here"] == 1
    assert load_retriever(version).search(["magma lava"], 1)[0].doc_ids == ["volcano-1"]


def test_an_unknown_kind_or_setting_is_a_clear_error(tmp_path, beir_dir, tiny_model_dir):
    root = workspace_for(tmp_path, beir_dir, tiny_model_dir, {"kind": "colbert"})
    with pytest.raises(ValueError, match="unknown retriever kind 'colbert': registered kinds are .*bm25"):
        load_params(root / "params.yaml")
    root = workspace_for(tmp_path / "b", beir_dir, tiny_model_dir, {"kind": "bm25", "bm25": {"k3": 1}})
    with pytest.raises(ValueError, match="k3"):
        load_params(root / "params.yaml")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        load_retriever(tmp_path / "empty")



# -- the contract, over every kind ---------------------------------------------------------------------
KINDS = sorted({*kind_names(), OverlapRetriever.kind})  # what the project registers, and the kind above
# settings that keep a kind's build small on the tiny corpus; a kind not named here runs with its defaults
SETTINGS = {"mlr": {"mlr": {"layers": [2, 1], "pooling": "multi"}},
            "incdsi": {"incdsi": {"tune_trials": 0, "tune_share": 0.2, "head_epochs": 2}}}
QUERIES = ["lava magma eruption", "comet orbit telescope", "sourdough butter oven", "astronomy planets"]


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model_dir):
    """``built(kind)``: a tiny workspace indexed by ``kind``, made on first use (untrained encoder: the
    contract does not depend on training)."""
    beir, roots = write_beir(tmp_path_factory.mktemp("beir")), {}

    def workspace(kind: str) -> Path:
        if kind not in roots:
            params = tiny_params(beir, tiny_model_dir, train={"enabled": False},
                                 retriever={"kind": kind, **SETTINGS.get(kind, {})}, freshness={"full_copy_every": 3})
            roots[kind] = run_stages(tmp_path_factory.mktemp(kind), params, "ingest", "querygen", "cluster", "train",
                                     "index").root
        return roots[kind]

    return workspace


def hits_of(retriever, queries=QUERIES, k: int = 5):
    hits = retriever.search(queries, k)
    return [h.doc_ids for h in hits], [h.scores for h in hits]


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_builds_searches_saves_and_loads_as_it_searched(built, tmp_path, kind):
    layout = Layout(built(kind))
    params = load_params(layout.root / "params.yaml")
    retriever = kind_class(kind).build(params, load_ingested(layout.ingested), layout)
    corpus = [row["_id"] for row in map(json.loads, (Path(params.data.path) / "corpus.jsonl").open())]
    assert sorted(retriever.live_ids()) == sorted(corpus)  # every document of the raw BEIR file, once

    ids, scores = hits_of(retriever)
    assert len(ids) == len(QUERIES) and any(ids)
    for query, row_ids, row_scores in zip(QUERIES, ids, scores):
        assert len(row_ids) == len(row_scores) <= 5  # a kind may return fewer (overlap: none below its minimum)
        assert len(set(row_ids)) == len(row_ids) and set(row_ids) <= set(corpus)
        assert list(row_scores) == sorted(row_scores, reverse=True)  # best first
        [alone] = retriever.search([query], 5)  # a query alone is answered as in a batch
        assert alone.doc_ids == row_ids
        np.testing.assert_allclose(alone.scores, row_scores, rtol=1e-5, atol=1e-6)

    manifest = save_retriever(retriever, tmp_path / "saved")
    assert (manifest["kind"], manifest["documents"]) == (kind, len(corpus))
    loaded = load_retriever(tmp_path / "saved", layout.encoder)
    assert type(loaded) is type(retriever) and loaded.live_ids() == retriever.live_ids()
    loaded_ids, loaded_scores = hits_of(loaded)
    assert loaded_ids == ids
    for got, want in zip(loaded_scores, scores):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_versions_are_deltas_until_every_nth_is_whole_and_each_loads_as_written(built, tmp_path, kind, monkeypatch):
    """Four updates (add, edit, remove, add) with ``freshness.full_copy_every: 3``: a kind that keeps
    deltas (it overrides ``save_delta``) stores v1, v2 and v4 as deltas and v3 whole, a kind that does
    not stores every version whole; each version, loaded through its chain, searches as the update
    left it in memory and as that retriever saved whole."""
    root = tmp_path / "workspace"
    shutil.copytree(built(kind), root)
    layout, params = Layout(root), load_params(root / "params.yaml")
    versions = RetrieverVersions(layout)
    in_memory = {}  # what each update produced before it was saved: the independent reference

    cls = type(versions.load())
    keeps_deltas = cls.save_delta is not Retriever.save_delta
    original = cls.save_delta

    def remember(self, directory):
        ids, scores = hits_of(self)
        save_retriever(self, tmp_path / "whole" / directory.name)  # the same retriever, saved whole
        in_memory[directory.name] = (ids, scores, sorted(self.live_ids()))
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
    if keeps_deltas:
        assert [bool(m.get("delta")) for m in manifests.values()] == [True, True, False, True]
        assert [m.get("delta_of") for m in manifests.values()] == ["base", "v0001", None, "v0003"]
        assert versions.chain("v0002") == [layout.retriever, versions.root / "v0001", versions.root / "v0002"]
        assert versions.chain("v0004") == [versions.root / "v0003", versions.root / "v0004"]
        assert not any((versions.root / "v0001").rglob("index.faiss"))  # no copy of the index in a delta
        with pytest.raises(ValueError, match="holds only the changes made to version base"):
            load_retriever(versions.root / "v0001", layout.encoder)
    else:
        assert [bool(m.get("delta")) for m in manifests.values()] == [False] * 4
        assert all(versions.chain(v) == [versions.root / v] for v in manifests)

    for name in ("v0001", "v0002", "v0004"):  # each version, loaded through its chain, is what was written
        loaded = versions.load_version(name)
        ids, scores, live = in_memory[name]
        for replayed in (loaded, load_retriever(tmp_path / "whole" / name, layout.encoder)):
            replayed_ids, replayed_scores = hits_of(replayed)
            assert replayed_ids == ids and sorted(replayed.live_ids()) == live
            for got, want in zip(replayed_scores, scores):
                np.testing.assert_allclose(got, want, rtol=1e-6)
    base = set(versions.load_version("base").live_ids())
    assert set(versions.load_version("v0002").live_ids()) == base | {"new-volcano"}
    assert set(versions.load_version("v0003").live_ids()) == base
    assert set(versions.load_version("v0004").live_ids()) == base | {"volcano-2"}
