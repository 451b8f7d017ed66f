"""BEIR's evaluation conventions: a query's own document is not an answer (ignore_identical_ids)."""

import json

import pytest
import yaml

from model_code.cli import main
from model_code.layout import Layout
from tests.conftest import run_stages, tiny_params
from tests.helpers.corpora import argument_corpus


def ingested_arguments(tmp_path, tiny_model_dir):
    """The argument corpus (queries that are documents too) ingested into a workspace, no dev carve."""
    from model_code.data.ingested import load_ingested

    beir = argument_corpus(tmp_path / "arguments")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(
        beir, tiny_model_dir, data={"source": "beir", "path": str(beir), "dev_fraction": 0.0})))
    assert main(["ingest", "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    return load_ingested(Layout(root).ingested)


@pytest.mark.parametrize("ignore, recall_at_1", [(True, 1.0), (False, 0.0)])
def test_a_querys_own_document_is_not_an_answer(tmp_path, tiny_model_dir, ignore, recall_at_1):
    beir = argument_corpus(tmp_path / "arguments")
    root = tmp_path / "ws"
    root.mkdir()
    params = tiny_params(beir, tiny_model_dir, retriever={"kind": "bm25", "bm25": {"stemmer": None, "stopwords": None}},
                         eval={"top_k": 10, "metrics": ["recall@1", "ndcg@10"], "ignore_identical_ids": ignore},
                         data={"source": "beir", "path": str(beir), "dev_fraction": 0.0})
    run_stages(root, params, "ingest", "index", "evaluate")
    metrics = json.loads((Layout(root).eval_report / "metrics.json").read_text())
    assert metrics["queries"] == 6 and metrics["recall@1"] == recall_at_1
    run = (Layout(root).eval_report / "run.trec").read_text().splitlines()
    first = {line.split()[0]: line.split()[2] for line in run if line.split()[3] == "1"}
    assert (first["a1"], first["b2"]) == (("a2", "b1") if ignore else ("a1", "b2"))
    assert all(len([r for r in run if r.startswith(f"{q} ")]) == 5 + (not ignore) for q in first)  # k kept


def test_dev_scoring_and_the_canary_follow_the_same_rule(tmp_path, tiny_model_dir):
    """With the rule each query's answer moves up one rank (its own document, identical text and so
    the nearest vector, no longer counts), so MRR rises strictly; without it nothing is found first."""
    from model_code.config import EncoderParams, FreshnessParams, HierarchyParams
    from model_code.eval.dev import DevScorer
    from model_code.freshness.drift import build_reference
    from model_code.models.encoder import Encoder
    from model_code.stores.faiss_store import FaissStore

    data = ingested_arguments(tmp_path, tiny_model_dir)
    encoder = Encoder(str(tiny_model_dir))
    settings = EncoderParams(max_query_length=16, max_passage_length=16, batch_size=8)

    def dev(metric: str, ignore: bool) -> float:
        scorer = DevScorer(data, metric, split="test", max_queries=10, ignore_identical_ids=ignore)
        return scorer.score_encoder(encoder, settings, 16)[0]

    assert dev("recall@1", ignore=False) == 0.0
    assert dev("mrr@10", ignore=True) > dev("mrr@10", ignore=False)

    vectors = encoder.encode(data.passages(), 16)
    index = FaissStore.build(vectors, data.corpus["doc_id"].tolist())

    def canary(ignore: bool) -> dict:
        reference = build_reference(index, lambda texts: encoder.encode(texts, 16), data,
                                    HierarchyParams(branching=2, niter=2), FreshnessParams(canary_queries=6),
                                    ignore_identical_ids=ignore, split="test")
        return reference.canary_at_training

    assert canary(False)["hit_rate@10"] == 1.0 and canary(True)["mrr@10"] > canary(False)["mrr@10"]


def test_the_canary_draws_only_queries_with_a_relevant_document(tmp_path, tiny_model_dir):
    """A query judged only not relevant scores 0 whatever the retriever does: drawn into the
    canary it would only dilute the drop the canary measures."""
    import numpy as np
    import pandas as pd

    from model_code.config import FreshnessParams, HierarchyParams
    from model_code.freshness.drift import build_reference
    from model_code.stores.faiss_store import FaissStore

    data = ingested_arguments(tmp_path, tiny_model_dir)
    qrels = data.qrels["test"]
    unjudged = min(qrels["query_id"])
    data.qrels["test"] = pd.concat([qrels[qrels["query_id"] != unjudged],
                                    qrels[qrels["query_id"] == unjudged].assign(relevance=0)])
    rng = np.random.default_rng(0)
    index = FaissStore.build(rng.standard_normal((len(data.corpus), 8)).astype(np.float32),
                             data.corpus["doc_id"].tolist())
    reference = build_reference(index, lambda texts: rng.standard_normal((len(texts), 8)).astype(np.float32), data,
                                HierarchyParams(branching=2, niter=2), FreshnessParams(canary_queries=1000),
                                split="test")
    drawn = set(reference.canary_qrels)
    assert drawn == set(qrels["query_id"]) - {unjudged} and len(reference.canary_vectors) == len(drawn)
