"""Kind ``bm25`` (``model_code/retrievers/bm25.py``): it scores as the BM25 formula computed by hand from
the raw BEIR files, takes additions and removals, and is deployable like the neural kinds."""

import json
import math
import re
from collections import Counter

import pytest

from model_code.config import load_params
from model_code.layout import Layout
from model_code.retrievers import load_retriever
from model_code.versions.chain import RetrieverVersions
from tests.conftest import cli, workspace_for
from tests.helpers.batches import write_batch
from tests.helpers.deployment import served_champion
from tracking.registry import register as register_model

WORDS = re.compile(r"\w\w+")


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
    corpus = {row["_id"]: f"{row['title']} {row['text']}" for row in map(json.loads, (beir_dir / "corpus.jsonl").open())}
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
