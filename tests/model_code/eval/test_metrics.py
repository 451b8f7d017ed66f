"""The metrics wrapper (``model_code/eval/metrics.py``) against hand computations: MRR, recall,
nDCG (linear gain, log2 discount), precision, MAP, hits and hit rate on a graded example with a query
that retrieved nothing and one missing from the run; trec_eval's order for tied scores; qrels from a
table; BEIR's dropping of a query's own document; the TREC run file line by line; unknown names
refused, in the metrics wrapper and when params.yaml is read."""

import math

import numpy as np
import pandas as pd
import pytest

from model_code.config import Params
from model_code.eval.metrics import evaluate, hits_to_run, qrels_dict, search_depth, write_trec_run

QRELS = {"q1": {"a": 2, "b": 1}, "q2": {"c": 1}, "q3": {"d": 1}, "q4": {"e": 1}}
# q1 ranks x, b, a, y; q2 finds c first; q3 retrieved nothing; q4 is not in the run; zz is not judged
RUN = {"q1": {"x": 0.9, "b": 0.8, "a": 0.7, "y": 0.1}, "q2": {"c": 0.5, "x": 0.4}, "q3": {}, "zz": {"d": 1.0}}


def test_metrics_are_the_hand_computed_means_over_every_judged_query():
    means, per_query = evaluate(QRELS, RUN, ["mrr@10", "recall@2", "recall@3", "ndcg@3", "hits@1"])
    # q1: first relevant at rank 2; nDCG@3 = (0 + 1/log2 3 + 2/log2 4) / (2 + 1/log2 3)
    ndcg_q1 = (1 / math.log2(3) + 2 / 2) / (2 + 1 / math.log2(3))
    want = {  # per query q1, q2, q3, q4
        "mrr@10": [0.5, 1.0, 0.0, 0.0],
        "recall@2": [0.5, 1.0, 0.0, 0.0],
        "recall@3": [1.0, 1.0, 0.0, 0.0],
        "ndcg@3": [ndcg_q1, 1.0, 0.0, 0.0],
        "hits@1": [0.0, 1.0, 0.0, 0.0],
    }
    assert set(means) == set(want)
    for metric, values in want.items():
        assert means[metric] == pytest.approx(sum(values) / 4, abs=1e-12), metric
        assert type(means[metric]) is float
    assert list(per_query["query_id"]) == ["q1", "q2", "q3", "q4"]
    assert list(per_query.columns) == ["query_id", "mrr@10", "recall@2", "recall@3", "ndcg@3", "hits@1"]
    for metric, values in want.items():
        assert per_query[metric].tolist() == pytest.approx(values, abs=1e-12), metric


def test_precision_map_hits_and_hit_rate_by_hand():
    """q1 ranks x, b, a, y with a (grade 2) and b relevant: 2 relevant in the top 3, the first at rank 2;
    AP@3 = (1/2 + 2/3) / 2 relevant. q2 finds c first; q3 and q4 have nothing."""
    means, per_query = evaluate(QRELS, RUN, ["precision@3", "map@3", "map@2", "hits@3", "hit_rate@3", "hit_rate@1"])
    want = {
        "precision@3": [2 / 3, 1 / 3, 0.0, 0.0],
        "map@3": [(1 / 2 + 2 / 3) / 2, 1.0, 0.0, 0.0],
        "map@2": [(1 / 2) / 2, 1.0, 0.0, 0.0],  # a (rank 3) is cut off but still counts as relevant
        "hits@3": [2.0, 1.0, 0.0, 0.0],
        "hit_rate@3": [1.0, 1.0, 0.0, 0.0],
        "hit_rate@1": [0.0, 1.0, 0.0, 0.0],
    }
    for metric, values in want.items():
        assert per_query[metric].tolist() == pytest.approx(values, abs=1e-12), metric
        assert means[metric] == pytest.approx(sum(values) / 4, abs=1e-12), metric


def test_tied_scores_rank_in_trec_evals_order_in_every_metric(tmp_path):
    """trec_eval (and so BEIR) ranks tied scores by document id, descending: with a, b, c tied and
    only a relevant, a is third, whatever order the run lists them in."""
    qrels = {"q": {"a": 1}}
    for run in ({"q": {"a": 0.5, "b": 0.5, "c": 0.5}}, {"q": {"c": 0.5, "a": 0.5, "b": 0.5}}):
        means, _ = evaluate(qrels, run, ["mrr@10", "mrr@2", "hit_rate@2", "hits@3", "recall@2", "ndcg@3"])
        assert means == pytest.approx({"mrr@10": 1 / 3, "mrr@2": 0.0, "hit_rate@2": 0.0, "hits@3": 1.0,
                                       "recall@2": 0.0, "ndcg@3": 1 / math.log2(4)}, abs=1e-12)
        write_trec_run(tmp_path / "run.trec", run, "r")
        assert [line.split()[2] for line in (tmp_path / "run.trec").read_text().splitlines()] == ["c", "b", "a"]
    # scores that differ below float32's precision are ties for trec_eval, so for every metric here
    near = {"q": {"a": 1.0 + 1e-8, "b": 1.0}}
    means, _ = evaluate(qrels, near, ["mrr@1", "mrr@10", "hits@1", "hit_rate@1", "ndcg@1"])
    assert means == {"mrr@1": 0.0, "mrr@10": 0.5, "hits@1": 0.0, "hit_rate@1": 0.0, "ndcg@1": 0.0}


@pytest.mark.parametrize("metric", ["ndcg", "ndcg@0", "ndcg@x", "mrr@-1", "P@10", "ndcg_cut@10", "foo@10"])
def test_an_unknown_metric_name_is_refused_with_the_supported_names(metric):
    with pytest.raises(ValueError, match=rf"unknown metric '{metric}': use one of ndcg@k, recall@k, precision@k, "
                       r"map@k, hit_rate@k, mrr@k, hits@k \(k a whole number >= 1\)"):
        evaluate(QRELS, RUN, ["ndcg@10", metric])


@pytest.mark.parametrize("section, value", [("eval", {"metrics": ["ndcg@10", "ndgc@10"]}),
                                            ("registry", {"metric": "mrr10"}), ("train", {"dev_metric": "map"})])
def test_params_refuse_an_unknown_metric_naming_the_setting(section, value):
    with pytest.raises(ValueError, match=rf"{section}\.(metrics|metric|dev_metric)[\s\S]*unknown metric"):
        Params.model_validate({section: value})


def test_one_metric_gives_a_dict_with_that_metric():
    means, per_query = evaluate(QRELS, RUN, ["mrr@10"])
    assert means == {"mrr@10": pytest.approx(1.5 / 4, abs=1e-12)} and type(means["mrr@10"]) is float
    assert per_query["mrr@10"].tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0], abs=1e-12)


def test_qrels_keep_every_judgement_as_ints_the_last_of_a_repeated_pair_holding():
    """As BEIR's loader reads a qrels file: grades of 0 and below are kept (not relevant), and the
    last row of a repeated (query, document) pair holds, whatever its grade."""
    table = pd.DataFrame({"query_id": ["q1", "q1", "q2", "q1", "q3", "q1", "q4"],
                          "doc_id": ["a", "b", "c", "d", "e", "a", "f"],
                          "relevance": np.array([2, 0, 1, 1, 0, 0, -1], dtype=np.int64)})
    qrels = qrels_dict(table)
    assert qrels == {"q1": {"a": 0, "b": 0, "d": 1}, "q2": {"c": 1}, "q3": {"e": 0}, "q4": {"f": -1}}
    assert all(type(v) is int for docs in qrels.values() for v in docs.values())


def test_a_query_judged_only_not_relevant_scores_0_and_counts_in_the_mean():
    """trec_eval and BEIR average over every judged query: q2 (judged 0) and q3 (judged -1) score 0
    whatever is retrieved, so the mean of a perfect q1 is 1/3 (it was 1: they were left out)."""
    qrels = qrels_dict(pd.DataFrame({"query_id": ["q1", "q2", "q3"], "doc_id": ["a", "z", "y"],
                                     "relevance": [1, 0, -1]}))
    means, per_query = evaluate(qrels, {"q1": {"a": 1.0}, "q2": {"z": 1.0}, "q3": {"y": 1.0}},
                                ["ndcg@10", "mrr@10", "recall@1"])
    assert means == pytest.approx({"ndcg@10": 1 / 3, "mrr@10": 1 / 3, "recall@1": 1 / 3}, abs=1e-12)
    assert per_query["query_id"].tolist() == ["q1", "q2", "q3"]


def test_a_document_listed_twice_keeps_its_first_rank_and_takes_one_place():
    """trec_eval refuses a run with a document twice; a retriever's hits keep its first, higher
    score, and the top k are k distinct documents."""
    run = hits_to_run(["q"], [["a", "b", "a", "c"]], [[0.9, 0.5, 0.1, 0.05]], 3, ignore_identical_ids=False)
    assert run == {"q": {"a": 0.9, "b": 0.5, "c": 0.05}}
    assert evaluate({"q": {"a": 1}}, run, ["mrr@10"])[0]["mrr@10"] == 1.0


def test_search_depth_leaves_room_for_the_querys_own_document():
    assert search_depth(10, True) == 11 and search_depth(10, False) == 10


def test_hits_to_run_drops_the_querys_own_document_then_keeps_k():
    """BEIR's ignore_identical_ids: query d2 is itself a document; its own hit is dropped before the
    top k are kept (a hit of another query is never dropped)."""
    scores = np.array([[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]], dtype=np.float32)
    ids = [["d2", "d5", "d6"], ["d7", "d2", "d8"]]
    dropped = hits_to_run(["d2", "q9"], ids, scores, 2, ignore_identical_ids=True)
    f = [[float(np.float32(s)) for s in row] for row in scores.tolist()]
    assert dropped == {"d2": {"d5": f[0][1], "d6": f[0][2]}, "q9": {"d7": f[1][0], "d2": f[1][1]}}
    kept = hits_to_run(["d2", "q9"], ids, scores, 2, ignore_identical_ids=False)
    assert kept == {"d2": {"d2": f[0][0], "d5": f[0][1]}, "q9": {"d7": f[1][0], "d2": f[1][1]}}
    assert all(type(s) is float for hits in dropped.values() for s in hits.values())
    assert list(dropped["d2"]) == ["d5", "d6"]  # rank order kept


def test_trec_run_file_is_one_line_per_hit_ranked_by_score(tmp_path):
    run = {"q2": {"a": 0.5, "b": 0.25}, "q1": {"c": 0.1, "d": 0.3, "e": 0.2}}
    write_trec_run(tmp_path / "run.trec", run, "mine")
    assert (tmp_path / "run.trec").read_text() == (
        "q1 Q0 d 1 0.3 mine\n"
        "q1 Q0 e 2 0.2 mine\n"
        "q1 Q0 c 3 0.1 mine\n"
        "q2 Q0 a 1 0.5 mine\n"
        "q2 Q0 b 2 0.25 mine\n"
    )


def test_metrics_perfect_partial_and_missing_queries():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    run = {"q1": {"a": 0.9, "x": 0.1}, "q2": {"x": 0.9, "b": 0.5}}  # q3 retrieved nothing
    means, per_query = evaluate(qrels, run, ["mrr@10", "recall@1", "recall@10"])
    assert means["mrr@10"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert means["recall@1"] == pytest.approx(1 / 3)
    assert means["recall@10"] == pytest.approx(2 / 3)
    assert list(per_query["query_id"]) == ["q1", "q2", "q3"]


def test_the_dev_score_breaks_ties_across_its_cut_as_the_evaluate_stage_does():
    """a and b tie at the top, b relevant: the evaluate stage keeps eval.top_k hits and ranks the
    tie by document id, descending (b first). Cut at the metric's depth first, the dev score kept
    the retriever's a and scored 0."""
    from model_code.data.ingested import IngestedData
    from model_code.eval.dev import DevScorer

    data = IngestedData(pd.DataFrame({"doc_id": ["a", "b", "c"], "title": "", "text": ["x", "y", "z"]}),
                        pd.DataFrame({"query_id": ["q"], "text": ["y"]}),
                        {"dev": pd.DataFrame({"query_id": ["q"], "doc_id": ["b"], "relevance": [1]})})
    hits, scores = [["a", "b", "c"]], [[0.5, 0.5, 0.1]]
    evaluated = evaluate(qrels_dict(data.qrels["dev"]), hits_to_run(["q"], hits, scores, 3, True), ["mrr@1"])[0]
    scorer = DevScorer(data, "mrr@1", top_k=3)
    assert scorer.depth == 4 and scorer.score_hits(hits, scores) == evaluated["mrr@1"] == 1.0
