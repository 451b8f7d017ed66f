"""IncDSI head: initialised from document embeddings, fine-tuned with CE; addition parameters tuned on a
simulated addition."""

from dataclasses import asdict

import pandas as pd
import torch
import torch.nn.functional as F

from model_code.methods.incdsi.head import AdditionParams
from model_code.methods.incdsi.head_training import build_head, finetune_head
from model_code.methods.incdsi.tuning import (
    best_trial,
    f_beta,
    held_out_queries,
    mrr_at_10,
    simulate_additions,
    tune_addition,
)


def toy(n_docs=40, per_doc=4, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    docs = F.normalize(torch.randn(n_docs, d, generator=g), dim=-1)
    rows = torch.arange(n_docs).repeat_interleave(per_doc)
    queries = F.normalize(docs[rows] + 0.4 * torch.randn(len(rows), d, generator=g), dim=-1)
    return docs, [f"d{i}" for i in range(n_docs)], queries, rows


def test_head_starts_as_the_dense_retriever_and_finetuning_lowers_the_loss():
    docs, ids, queries, rows = toy()
    head = build_head(docs, ids, queries, rows)
    assert torch.equal(head.weights, docs)
    assert torch.allclose(head.rep_queries[0], queries[rows == 0].mean(0))
    relevant = [ids[r] for r in rows.tolist()]
    before = mrr_at_10(head, queries, relevant)
    losses = finetune_head(head, queries, rows, epochs=15, learning_rate=0.05)
    assert losses[-1] < losses[0]
    assert mrr_at_10(head, queries, relevant) > before


def test_f_beta_weighs_old_documents():
    assert f_beta(1.0, 1.0) == 1.0 and f_beta(0.0, 0.0) == 0.0
    assert f_beta(0.2, 0.9) > f_beta(0.9, 0.2)


def toy_pairs(rows, ids, natural_per_doc):
    """(doc_id, query, natural) rows in ``toy`` order: the first ``natural_per_doc`` of each document natural."""
    rank = torch.cat([torch.arange((rows == r).sum()) for r in rows.unique()])
    return pd.DataFrame({"doc_id": [ids[r] for r in rows.tolist()], "query": [f"q{i}" for i in range(len(rows))],
                         "natural": (rank < natural_per_doc).tolist()})


def test_held_out_queries_are_half_the_natural_ones_else_one_generated_per_document():
    pairs = pd.DataFrame({"doc_id": ["a", "a", "b", "c", "c"], "query": list("vwxyz"), "natural": [False] * 5})
    assert held_out_queries(pairs).tolist() == [False, True, False, False, True]  # b keeps its only query
    pairs.loc[2, "natural"] = True
    assert held_out_queries(pairs).tolist() == [False, False, True, False, False]  # at least one held out
    natural = pd.DataFrame({"doc_id": [f"d{i % 7}" for i in range(40)], "query": [f"q{i % 20}" for i in range(40)],
                            "natural": [True] * 30 + [False] * 10})
    held = held_out_queries(natural, share=0.5, seed=3)
    assert not held[30:].any()  # generated queries always train
    held_queries = set(natural.loc[held, "query"])
    assert len(held_queries) == 10  # half of the 20 distinct natural queries...
    assert all(h == (q in held_queries) for h, q in zip(held[:30], natural["query"][:30]))  # ...for every document


def test_simulation_leaves_the_additions_out_of_the_head_and_scores_only_held_out_queries():
    docs, ids, queries, rows = toy()
    tune = ids[36:]
    pairs = toy_pairs(rows, ids, natural_per_doc=1)
    simulation = simulate_additions(docs[:36], ids[:36], pairs, queries, docs[36:], tune, share=0.25, epochs=2,
                                    seed=0)
    added = set(simulation.additions)
    assert set(tune) <= added and len(added) == 9  # 4 tune documents topped up to 25 % of the 36-row head
    assert added.isdisjoint(simulation.head.doc_ids) and len(simulation.head.doc_ids) == 36 - 5
    held = held_out_queries(pairs, seed=0)
    generated = queries[torch.from_numpy(~held & ~pairs["natural"].to_numpy())]  # what a deployed addition has
    for doc_id, (added_queries, _) in simulation.additions.items():
        expected = generated[torch.from_numpy((pairs.loc[~held & ~pairs["natural"], "doc_id"] == doc_id).to_numpy())]
        assert torch.equal(added_queries, expected), doc_id  # never its natural queries, never a scored one
    assert all(torch.equal(doc, docs[ids.index(d)]) for d, (_, doc) in simulation.additions.items())
    scored = queries[torch.from_numpy(held & pairs["natural"].to_numpy())]
    for vectors, relevant in (simulation.new_eval, simulation.old_eval):
        assert all(any(torch.equal(v, n) for n in scored) for v in vectors)  # held-out natural queries only
    scorable = set(pairs.loc[held, "doc_id"])
    assert set(simulation.new_eval[1]) == added & scorable
    assert set(simulation.old_eval[1]) == set(simulation.head.doc_ids) & scorable


def test_tuning_loop_runs_trials_and_returns_parameters_in_range():
    docs, ids, queries, rows = toy()
    simulation = simulate_additions(docs[:36], ids[:36], toy_pairs(rows, ids, 1), queries, docs[36:], ids[36:],
                                    share=0.2, epochs=2)
    head_rows = len(simulation.head.doc_ids)
    best, history = tune_addition(simulation, trials=2, seed=0)
    before, trials = history[0], history[1:]
    assert before["params"] is None and 0 < before["old_mrr@10"] <= 1
    assert len(trials) == 2 and all(h["value"] == f_beta(h["new_mrr@10"], h["old_mrr@10"]) for h in trials)
    # the kept parameters are the best trial's (search space and wiring: test_method_incdsi.py)
    assert asdict(best) == {**asdict(AdditionParams()), **max(trials, key=lambda t: t["value"])["params"]}
    assert len(simulation.head.doc_ids) == head_rows  # trials work on copies


def test_constrained_objective_keeps_the_best_new_score_within_the_allowed_old_drop():
    trials = [{"params": {"g": 1}, "value": 0.50, "new_mrr@10": 0.6, "old_drop": 0.030},
              {"params": {"g": 2}, "value": 0.48, "new_mrr@10": 0.3, "old_drop": 0.008},
              {"params": {"g": 3}, "value": 0.49, "new_mrr@10": 0.2, "old_drop": 0.002}]
    assert best_trial(trials, "fbeta", 0.01)["params"] == {"g": 1}
    assert best_trial(trials, "constrained", 0.01)["params"] == {"g": 2}
    assert best_trial(trials, "constrained", 0.001)["params"] == {"g": 3}  # none feasible: smallest drop


def test_constrained_tuning_reports_each_trials_drop():
    docs, ids, queries, rows = toy()
    simulation = simulate_additions(docs[:36], ids[:36], toy_pairs(rows, ids, 1), queries, docs[36:], ids[36:],
                                    share=0.2, epochs=2)
    best, history = tune_addition(simulation, trials=3, seed=0, objective="constrained", max_old_drop=0.05)
    before, trials = history[0], history[1:]
    assert all(abs(t["old_drop"] - (before["old_mrr@10"] - t["old_mrr@10"])) < 1e-12 for t in trials)
    assert all(t["value"] == t["new_mrr@10"] for t in trials)
    assert asdict(best) == {**asdict(AdditionParams()), **best_trial(trials, "constrained", 0.05)["params"]}
