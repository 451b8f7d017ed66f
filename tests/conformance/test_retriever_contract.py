"""The retriever contract: a kind defined here, outside the project, runs through index ->
evaluate -> register -> serve -> add-documents without touching any project module; the bm25
kind scores as the BM25 formula computed by hand and is deployable like the neural kinds."""

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
import yaml
from pydantic import BaseModel

from model_code.cli import main
from model_code.config import load_params
from model_code.data.ingested import passage_texts
from model_code.layout import Layout
from model_code.retrievers import Retriever, SearchHit, kind_class, kind_names, load_retriever, register
from model_code.retrievers.registry import unregister
from model_code.versions.chain import RetrieverVersions
from tests.conftest import tiny_params
from tests.helpers.batches import write_batch
from tests.helpers.deployment import served_champion
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


@pytest.fixture(autouse=True)
def overlap_kind():
    """The kind exists while a test of this module runs, as a user's plugin would register it."""
    register(OverlapRetriever)
    yield
    unregister("overlap")


def workspace_for(tmp_path, beir_dir, tiny_model_dir, retriever: dict) -> Path:
    root = tmp_path / "ws"
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir, retriever=retriever)))
    return root


def cli(root: Path, *args: str) -> int:
    return main([*args, "--params", str(root / "params.yaml"), "--root", str(root)])


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
    corpus = {row["_id"]: f"{row['title']}. {row['text']}" for row in map(json.loads, (beir_dir / "corpus.jsonl").open())}
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


def lucene_bm25(query: str, documents: dict[str, str], k1: float = 1.5, b: float = 0.75) -> dict[str, float]:
    """BM25 as Lucene (8 and later) scores it: idf log(1 + (N - df + .5) / (df + .5)) and no (k1 + 1) factor
    in the numerator (Kamphuis et al., "Which BM25 do you mean?", ECIR 2020), over lowercase word tokens."""
    tokens = {d: WORDS.findall(t.lower()) for d, t in documents.items()}
    average = sum(map(len, tokens.values())) / len(tokens)
    frequency = Counter(w for ts in tokens.values() for w in set(ts))
    scores = {}
    for doc_id, ts in tokens.items():
        counts, score = Counter(ts), 0.0
        for word in set(WORDS.findall(query.lower())):
            if counts[word]:
                idf = math.log(1 + (len(tokens) - frequency[word] + 0.5) / (frequency[word] + 0.5))
                score += idf * counts[word] / (counts[word] + k1 * (1 - b + b * len(ts) / average))
        scores[doc_id] = score
    return scores


def test_bm25_kind_scores_as_the_formula_and_is_deployable(tmp_path, beir_dir, tiny_model_dir, mlflow_uri):
    settings = {"stemmer": None, "stopwords": None, "k1": 1.2, "b": 0.6}
    root = workspace_for(tmp_path, beir_dir, tiny_model_dir, {"kind": "bm25", "bm25": settings})
    assert cli(root, "all") == 0
    layout = Layout(root)
    retriever = load_retriever(layout.retriever)
    corpus = {row["_id"]: f"{row['title']}. {row['text']}" for row in map(json.loads, (beir_dir / "corpus.jsonl").open())}
    query = "comet telescope orbit"
    expected = lucene_bm25(query, corpus, k1=1.2, b=0.6)
    (hit,) = retriever.search([query], 5)
    assert hit.scores == pytest.approx([expected[d] for d in hit.doc_ids], rel=1e-5)  # each document's score
    assert hit.scores == pytest.approx(sorted(expected.values(), reverse=True)[:5], rel=1e-5)  # the best five (ties aside)

    batch = write_batch(tmp_path / "new.jsonl", [{"_id": "volcano-1", "title": "volcano", "text": "lava magma crater"}])
    assert cli(root, "add-documents", str(batch)) == 0
    assert cli(root, "remove-documents", "astronomy-0") == 0
    current = RetrieverVersions(layout).load()
    assert current.search(["lava magma"], 1)[0].doc_ids == ["volcano-1"]
    assert "astronomy-0" not in current.live_ids() and len(current.live_ids()) == 48

    uri = mlflow_uri
    assert register_model(load_params(root / "params.yaml"), layout, tracking_uri=uri)["retriever"] == "bm25"
    with open(tmp_path / "serve.log", "w") as log_file, served_champion(uri, log_file) as post:
        status, body = post({"inputs": ["guitar melody chord"], "params": {"k": 3}})
        assert status == 200 and json.loads(body)["predictions"][0]["doc_ids"][0].startswith("music-")
