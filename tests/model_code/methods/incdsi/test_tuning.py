"""IncDSI's tuning (``model_code/methods/incdsi/tuning.py``): the tuning loop on a scripted head whose
rankings are a known function of the addition parameters, so every trial's MRR@10, F_beta, drop and
the kept trial are computed by hand, and the optuna study is checked against a reference study run
separately with the documented search space and objective; then on a toy head, the simulated
addition (held-out queries, the additions left out of the head) and F_beta = (1 + b^2) new old /
(b^2 new + old) over the reference code's search space, and the constrained objective."""

import copy
import math
from dataclasses import asdict, replace

import optuna
import pandas as pd
import pytest
import torch

from model_code.methods.incdsi import tuning
from model_code.methods.incdsi.head import INITS, AdditionParams
from model_code.methods.incdsi.tuning import (
    AdditionSimulation,
    best_trial,
    f_beta,
    held_out_queries,
    simulate_additions,
    tune_addition,
)
from tests.helpers.incdsi import toy, toy_pairs

NEW = ["nd0", "nd1", "nd2"]  # the simulated additions (and their held-out queries' documents)
OLD = ["od0", "od1", "od2", "od3"]  # kept documents, each with one held-out query


def ranks(params: AdditionParams) -> tuple[int, int]:
    """Where a new document's query finds it, and where an old one's finds its document, after
    additions with ``params``: ranks 1 + floor(gamma1) and 1 + floor(gamma2) (both within 10)."""
    return 1 + math.floor(params.gamma1), 1 + math.floor(params.gamma2)


class ScriptedHead:
    """A head stand-in: before any addition old queries find their document first and new ones
    find nothing; after additions the ranks are ``ranks(params)``. Query row [0, i] is the i-th
    new query, [1, i] the i-th old one."""

    def __init__(self):
        self.added: list[tuple[str, AdditionParams, torch.Tensor, torch.Tensor]] = []

    def add(self, doc_id, queries, params, document):
        self.added.append((doc_id, params, queries, document))

    def search(self, queries, k):
        assert k == 10
        params = {p for _, p, _, _ in self.added}
        assert len(params) <= 1  # one trial's parameters per copy
        new_rank, old_rank = ranks(params.pop()) if params else (None, 1)
        ids = []
        for kind, i in queries.tolist():
            relevant = (NEW if kind == 0 else OLD)[int(i)]
            rank = new_rank if kind == 0 else old_rank
            row = [f"f0{j}" for j in range(10)]
            if rank is not None:
                row[rank - 1] = relevant
            ids.append(row)
        return torch.arange(10, 0, -1, dtype=torch.float32).repeat(len(ids), 1).numpy(), ids


def simulation() -> AdditionSimulation:
    additions = {d: (torch.full((2, 3), float(i)), torch.full((3,), -float(i))) for i, d in enumerate(NEW)}
    new_eval = (torch.tensor([[0, i] for i in range(len(NEW))]), list(NEW))
    old_eval = (torch.tensor([[1, i] for i in range(len(OLD))]), list(OLD))
    return AdditionSimulation(ScriptedHead(), additions, new_eval, old_eval)


def by_hand(params: dict, beta: float) -> dict:
    new_rank, old_rank = ranks(replace(AdditionParams(), **params))
    new, old = 1 / new_rank, 1 / old_rank
    return {"new": new, "old": old, "drop": 1.0 - old, "fbeta": (1 + beta**2) * new * old / (beta**2 * new + old)}


def reference_study(trials: int, seed: int, objective: str, beta: float = 5.0, max_old_drop: float = 0.01):
    """The documented study, run with optuna directly: TPE seeded, maximising; lambda1 in
    [0.05, 0.95], gamma1 and gamma2 in [0, 8], lambda2 in [1e-10, 1e-3] on a log scale, init one of
    INITS (suggested in that order); the value is F_beta(new, old) or, constrained, new with the
    constraint drop - max_old_drop <= 0."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))

    def value(trial):
        params = {"lambda1": trial.suggest_float("lambda1", 0.05, 0.95), "gamma1": trial.suggest_float("gamma1", 0, 8),
                  "gamma2": trial.suggest_float("gamma2", 0, 8),
                  "lambda2": trial.suggest_float("lambda2", 1e-10, 1e-3, log=True),
                  "init": trial.suggest_categorical("init", list(INITS))}
        scores = by_hand(params, beta)
        if objective == "fbeta":
            return scores["fbeta"]
        trial.set_constraint("drop", scores["drop"] - max_old_drop)
        return scores["new"]

    study.optimize(value, n_trials=trials)
    return [t.params for t in study.trials]


def test_each_trial_adds_every_document_with_its_parameters_and_scores_f_beta_by_hand():
    sim = simulation()
    base = AdditionParams(max_steps=7, tolerance=0.5, seed=9)
    best, history = tune_addition(sim, trials=6, seed=3, beta=2.0, base=base)
    assert history[0] == {"params": None, "value": None, "old_mrr@10": 1.0}  # the head before any addition
    trials = history[1:]
    assert len(trials) == 6 and sim.head.added == []  # trials add to copies
    for t in trials:
        assert set(t["params"]) == {"lambda1", "gamma1", "gamma2", "lambda2", "init"} and t["params"]["init"] in INITS
        want = by_hand(t["params"], beta=2.0)
        assert t["new_mrr@10"] == pytest.approx(want["new"]) and t["old_mrr@10"] == pytest.approx(want["old"])
        assert t["old_drop"] == pytest.approx(want["drop"]) and t["value"] == pytest.approx(want["fbeta"])
    values = [t["value"] for t in trials]
    assert len(set(values)) > 1
    assert asdict(best) == {**asdict(base), **trials[values.index(max(values))]["params"]}
    assert [t["params"] for t in trials] == reference_study(6, 3, "fbeta", beta=2.0)


def test_a_trial_adds_each_simulated_document_in_order_with_the_trials_parameters(monkeypatch):
    copies = []
    deepcopy = copy.deepcopy

    def recording(x, *args):
        made = deepcopy(x, *args)
        if isinstance(x, ScriptedHead):
            copies.append(made)
        return made

    monkeypatch.setattr(copy, "deepcopy", recording)
    sim = simulation()
    base = AdditionParams(max_steps=7)
    _, history = tune_addition(sim, trials=2, seed=0, base=base)
    assert len(copies) == 2
    for head, trial in zip(copies, history[1:]):
        assert [d for d, _, _, _ in head.added] == NEW
        for (doc_id, params, queries, document), i in zip(head.added, range(len(NEW))):
            assert params == replace(base, **trial["params"])
            assert torch.equal(queries, sim.additions[doc_id][0]) and torch.equal(document, sim.additions[doc_id][1])


def test_defaults_are_twenty_trials_seed_0_beta_5_and_the_default_parameters():
    best, history = tune_addition(simulation())
    trials = history[1:]
    assert len(trials) == 20
    assert [t["params"] for t in trials] == reference_study(20, 0, "fbeta", beta=5.0)
    for t in trials:
        assert t["value"] == pytest.approx(by_hand(t["params"], beta=5.0)["fbeta"])
    assert f_beta(0.5, 0.25) == pytest.approx(26 * 0.5 * 0.25 / (25 * 0.5 + 0.25))  # beta 5 by default
    top = max(trials, key=lambda t: t["value"])["params"]
    assert asdict(best) == {**asdict(AdditionParams()), **top}


@pytest.mark.parametrize("max_old_drop", [0.6, None])
def test_constrained_tuning_tells_tpe_the_allowed_drop(max_old_drop):
    """16 trials: past TPE's 10 random start-up trials the constraint steers the sampling, so the
    suggested parameters match a study told drop - max_old_drop <= 0 (0.6: feasible when
    gamma2 < 2; None: the default, 0.01)."""
    kwargs = {} if max_old_drop is None else {"max_old_drop": max_old_drop}
    allowed = 0.01 if max_old_drop is None else max_old_drop
    best, history = tune_addition(simulation(), trials=16, seed=4, objective="constrained", **kwargs)
    trials = history[1:]
    assert [t["params"] for t in trials] == reference_study(16, 4, "constrained", max_old_drop=allowed)
    for t in trials:
        assert t["value"] == pytest.approx(by_hand(t["params"], 5.0)["new"])
    feasible = [t for t in trials if t["old_drop"] <= allowed]
    if max_old_drop is not None:
        assert 0 < len(feasible) < len(trials)
    pick = max(feasible, key=lambda t: t["new_mrr@10"]) if feasible else min(trials, key=lambda t: t["old_drop"])
    assert asdict(best) == {**asdict(AdditionParams()), **pick["params"]}


def test_an_unknown_objective_is_named():
    with pytest.raises(ValueError) as error:
        tune_addition(simulation(), trials=1, objective="best")
    assert str(error.value) == "unknown tuning objective 'best' (use one of ('fbeta', 'constrained'))"


def test_f_beta_is_zero_when_either_side_is_zero():
    """(1 + b^2) n o / (b^2 n + o): zero when n or o is 0 and the other is not; 0/0 taken as 0."""
    assert f_beta(0.0, 0.7) == 0.0 and f_beta(0.7, 0.0) == 0.0 and f_beta(0.0, 0.0) == 0.0
    assert f_beta(0.4, 0.8, beta=1.0) == pytest.approx(2 * 0.4 * 0.8 / 1.2)


def simulation_case(naturals: int = 2, generated: int = 2, head_naturals: int | None = None):
    """20 head documents h00..h19 and 3 tune documents t00..t02, each with ``naturals`` natural
    queries (head documents: ``head_naturals`` if given) and ``generated`` generated ones (t02:
    natural ones only). Vectors name their row: query row i is (i, i, i, i), document j's vector
    (1000 + j, ...)."""
    head, tune = [f"h{i:02d}" for i in range(20)], ["t00", "t01", "t02"]
    rows = []
    for d in head + tune:
        n = naturals if head_naturals is None or d in tune else head_naturals
        rows += [(d, f"natural {d} {i}", True) for i in range(n)]
        rows += [(d, f"generated {d} {i}", False) for i in range(generated if d != "t02" else 0)]
    pairs = pd.DataFrame(rows, columns=["doc_id", "query", "natural"])
    queries = torch.arange(len(pairs), dtype=torch.float32)[:, None].repeat(1, 4)
    vectors = (1000 + torch.arange(23, dtype=torch.float32))[:, None].repeat(1, 4)
    return head, tune, pairs, queries, vectors[:20], vectors[20:]


def rows_of(vectors: torch.Tensor) -> list[int]:
    return vectors[:, 0].long().tolist()


@pytest.fixture
def trained(monkeypatch):
    """train_head replaced by a recorder (the simulation's own steps are what is checked here)."""
    calls = []

    def train_head(doc_vectors, doc_ids, query_vectors, owners, epochs, learning_rate, seed):
        calls.append({"docs": rows_of(doc_vectors), "doc_ids": list(doc_ids), "queries": rows_of(query_vectors),
                      "owners": list(owners), "epochs": epochs, "learning_rate": learning_rate, "seed": seed})
        return "the head", None, None

    monkeypatch.setattr(tuning, "train_head", train_head)
    return calls


@pytest.mark.parametrize("seed", [0, 5])
def test_simulation_step_by_step(trained, seed):
    """Held-out queries (half the natural ones); the tune documents plus a random sample of the head,
    share 0.5 of the head in all; the temporary head trained on the kept documents' other queries;
    each addition made of its document's generated queries (its own vector when it has none); the
    evaluations of held-out queries only, at most max_eval_queries, distinct, in row order."""
    head, tune, pairs, queries, vectors, tune_vectors = simulation_case()
    sim = simulate_additions(vectors, head, pairs, queries, tune_vectors, tune, share=0.5, epochs=3,
                             learning_rate=0.25, seed=seed, max_eval_queries=6)
    held = held_out_queries(pairs, seed=seed)
    assert held.sum() == 23  # half of the 46 natural queries
    trainable = set(pairs.loc[~held, "doc_id"])
    simulated = set(sim.additions)
    assert {d for d in tune if d in trainable} <= simulated and len(simulated) == 10  # round(0.5 * 20)
    assert simulated - set(tune) <= set(head)
    kept = [d for d in head if d not in simulated]
    owners = pairs["doc_id"].tolist()
    [call] = trained
    assert call["doc_ids"] == kept and call["docs"] == [1000 + head.index(d) for d in kept]
    train = [i for i in range(len(pairs)) if not held[i] and owners[i] in kept]
    assert call["queries"] == train and call["owners"] == [owners[i] for i in train]
    assert (call["epochs"], call["learning_rate"], call["seed"]) == (3, 0.25, seed)
    assert sim.head == "the head" and list(sim.additions) == sorted(simulated)
    for d, (added, document) in sim.additions.items():
        assert rows_of(document[None]) == [1000 + (head + tune).index(d)]
        mine = [i for i in range(len(pairs)) if owners[i] == d and not pairs["natural"].iat[i]]
        assert rows_of(added) == (mine if mine else rows_of(document[None]))  # t02 has no generated queries
    for (vectors_, relevant), documents in ((sim.new_eval, simulated), (sim.old_eval, set(kept))):
        chosen = rows_of(vectors_)
        assert len(chosen) == 6 and chosen == sorted(set(chosen))  # at most 6, distinct, in row order
        assert all(held[i] and owners[i] in documents for i in chosen) and relevant == [owners[i] for i in chosen]
    again = simulate_additions(vectors, head, pairs, queries, tune_vectors, tune, share=0.5, epochs=3,
                               learning_rate=0.25, seed=seed, max_eval_queries=6)
    assert set(again.additions) == simulated and rows_of(again.old_eval[0]) == rows_of(sim.old_eval[0])  # seeded


def test_a_small_share_adds_the_tune_documents_alone_and_a_large_one_keeps_one_head_document(trained):
    head, tune, pairs, queries, vectors, tune_vectors = simulation_case(naturals=4)
    held = held_out_queries(pairs, seed=1)
    trainable_tune = {d for d in tune if d in set(pairs.loc[~held, "doc_id"])}
    sim = simulate_additions(vectors, head, pairs, queries, tune_vectors, tune, share=0.05, epochs=1, seed=1)
    assert set(sim.additions) == trainable_tune  # round(0.05 * 20) = 1 < the tune documents: no head sample
    sim = simulate_additions(vectors, head, pairs, queries, tune_vectors, tune, share=1.5, epochs=1, seed=1)
    assert set(sim.additions) == trainable_tune | (set(head) - set(trained[-1]["doc_ids"]))
    assert len(trained[-1]["doc_ids"]) == 1  # the head keeps one document


def test_defaults_share_0_1_twenty_epochs_and_at_most_2000_evaluation_queries(trained):
    head, tune, pairs, queries, vectors, tune_vectors = simulation_case(naturals=440, generated=1)
    sim = simulate_additions(vectors, head, pairs, queries, tune_vectors, tune)
    held = held_out_queries(pairs, seed=0)
    trainable_tune = {d for d in tune if d in set(pairs.loc[~held, "doc_id"])}
    assert set(sim.additions) == trainable_tune  # round(0.1 * 20) = 2 <= 3 tune documents
    assert (trained[0]["epochs"], trained[0]["learning_rate"], trained[0]["seed"]) == (20, 1e-3, 0)
    kept_held = sum(1 for i, d in enumerate(pairs["doc_id"]) if held[i] and d in head)
    assert kept_held > 2000 and len(sim.old_eval[1]) == 2000
    assert len(sim.new_eval[1]) == sum(1 for i, d in enumerate(pairs["doc_id"]) if held[i] and d in trainable_tune)


def test_a_simulation_without_documents_to_add_is_an_error(trained):
    head, _, pairs, queries, vectors, tune_vectors = simulation_case()
    with pytest.raises(ValueError) as error:
        simulate_additions(vectors, head, pairs, queries, tune_vectors[:0], [], share=0.0, seed=0)
    assert str(error.value) == "the tuning simulation needs documents both to keep and to add"
    assert trained == []


def test_a_simulation_without_held_out_queries_of_kept_documents_is_an_error(trained):
    """Only the tune documents have natural queries: every held-out query belongs to an addition,
    none is left to score the kept documents with."""
    head, tune, pairs, queries, vectors, tune_vectors = simulation_case(naturals=2, head_naturals=0)
    held = held_out_queries(pairs, seed=2)
    with pytest.raises(ValueError) as error:
        simulate_additions(vectors, head, pairs, queries, tune_vectors, tune, share=0.15, seed=2)
    new_held = sum(1 for i, d in enumerate(pairs["doc_id"]) if held[i] and d in tune)
    assert new_held == 3  # half of the 6 natural queries, all of tune documents
    assert str(error.value) == ("the tuning simulation has no held-out queries to score (3 of simulated additions, "
                                "0 of kept documents): raise incdsi.tune_share or add queries")


def test_a_drop_of_exactly_the_allowed_amount_is_within_it():
    from model_code.methods.incdsi.tuning import best_trial

    trials = [{"params": {"g": 1}, "value": 0.5, "new_mrr@10": 0.6, "old_drop": 0.25},
              {"params": {"g": 2}, "value": 0.4, "new_mrr@10": 0.3, "old_drop": 0.125}]
    assert best_trial(trials, "constrained", 0.25)["params"] == {"g": 1}  # "drops by at most max_old_drop"


def test_f_beta_weighs_old_documents():
    assert f_beta(1.0, 1.0) == 1.0 and f_beta(0.0, 0.0) == 0.0
    assert f_beta(0.2, 0.9) > f_beta(0.9, 0.2)


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
    # the kept parameters are the best trial's (search space and wiring:
    # test_tuning_scores_trials_with_f_beta_of_new_and_old_and_keeps_the_best)
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


def test_tuning_scores_trials_with_f_beta_of_new_and_old_and_keeps_the_best(monkeypatch):
    """F_beta by hand; each trial's value is F_beta(new, old) in that order; the kept parameters are
    the best trial's; the study maximises; the search space is the reference code's."""
    assert f_beta(0.5, 1.0, beta=5) == pytest.approx(26 * 0.5 / (25 * 0.5 + 1))
    assert f_beta(1.0, 0.5, beta=2) == pytest.approx(5 * 0.5 / (4 * 1.0 + 0.5))
    space, directions = {}, []
    suggest_float, create_study = optuna.trial.Trial.suggest_float, optuna.create_study

    def recording_float(self, name, low, high, *args, log=False, **kwargs):
        space[name] = (low, high, log)
        return suggest_float(self, name, low, high, *args, log=log, **kwargs)

    def recording_study(*args, **kwargs):
        directions.append(kwargs.get("direction"))
        return create_study(*args, **kwargs)

    monkeypatch.setattr(optuna.trial.Trial, "suggest_float", recording_float)
    monkeypatch.setattr(optuna, "create_study", recording_study)
    docs, ids, queries, rows = toy()
    simulation = simulate_additions(docs[:36], ids[:36], toy_pairs(rows, ids, 1), queries, docs[36:], ids[36:],
                                    share=0.2, epochs=2)
    best, history = tune_addition(simulation, trials=4, seed=1, beta=2.0)
    trials = history[1:]
    for t in trials:
        new, old = t["new_mrr@10"], t["old_mrr@10"]
        assert t["value"] == pytest.approx(5 * new * old / (4 * new + old) if new + old else 0.0)
    assert any(abs(t["new_mrr@10"] - t["old_mrr@10"]) > 0.05 for t in trials)  # the order matters here
    values = [t["value"] for t in trials]
    assert max(values) > min(values)
    top = trials[values.index(max(values))]["params"]
    assert {k: getattr(best, k) for k in top} == top
    assert directions == ["maximize"]
    assert space == {"lambda1": (0.05, 0.95, False), "gamma1": (0.0, 8.0, False), "gamma2": (0.0, 8.0, False),
                     "lambda2": (1e-10, 1e-3, True)}


def test_best_trial_is_the_highest_f_beta():
    trials = [{"params": {"g": i}, "value": v, "new_mrr@10": 0.5, "old_drop": 0.0}
              for i, v in enumerate([0.3, 0.9, 0.1, 0.5])]
    assert best_trial(trials, "fbeta", 0.01)["params"] == {"g": 1}
    assert best_trial(list(reversed(trials)), "fbeta", 0.01)["params"] == {"g": 1}
