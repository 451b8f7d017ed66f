"""Tune the IncDSI addition hyper-parameters on the *tune* split (IncDSI §5).

Each trial adds the tune documents to a copy of the head with candidate (lambda1, gamma1,
gamma2, lambda2) and scores F_beta (beta = 5) of MRR@10 on the tune documents' queries ("new")
and on the old documents' queries ("old"): beta = 5 weighs keeping the old documents' quality
far above retrieving the new ones. Search space as in the reference code: lambda1 in
[0.05, 0.95], gamma1 and gamma2 in [0, 8], lambda2 in [1e-10, 1e-3] on a log scale.

Optimiser: optuna's TPE sampler (Bayesian optimisation), seeded. Ax (the reference code's
choice) pulls botorch/gpytorch and their own torch requirements into the environment, which the
pinned CPU torch setup here avoids.
"""

from __future__ import annotations

import copy
from dataclasses import asdict

import optuna
import torch

from model_code.eval.metrics import evaluate
from model_code.incremental.incdsi import AdditionParams, IncDSIHead


def f_beta(new: float, old: float, beta: float = 5.0) -> float:
    if new == 0 and old == 0:
        return 0.0
    return (1 + beta**2) * new * old / (beta**2 * new + old)


def mrr_at_10(head: IncDSIHead, queries: torch.Tensor, relevant: list[str]) -> float:
    scores, ids = head.search(queries, 10)
    run = {f"q{i}": dict(zip(row_ids, row.tolist())) for i, (row_ids, row) in enumerate(zip(ids, scores))}
    qrels = {f"q{i}": {doc: 1} for i, doc in enumerate(relevant)}
    return evaluate(qrels, run, ["mrr@10"])[0]["mrr@10"]


def tune_addition(
    head: IncDSIHead,
    tune_docs: dict[str, torch.Tensor],
    tune_eval: tuple[torch.Tensor, list[str]],
    old_eval: tuple[torch.Tensor, list[str]],
    trials: int = 30,
    seed: int = 0,
    beta: float = 5.0,
) -> tuple[AdditionParams, list[dict]]:
    """Return the best ``AdditionParams`` and every trial's parameters and scores."""

    def objective(trial: optuna.Trial) -> float:
        params = AdditionParams(
            lambda1=trial.suggest_float("lambda1", 0.05, 0.95),
            gamma1=trial.suggest_float("gamma1", 0.0, 8.0),
            gamma2=trial.suggest_float("gamma2", 0.0, 8.0),
            lambda2=trial.suggest_float("lambda2", 1e-10, 1e-3, log=True),
        )
        candidate = copy.deepcopy(head)
        for doc_id, queries in tune_docs.items():
            candidate.add(doc_id, queries, params)
        new, old = mrr_at_10(candidate, *tune_eval), mrr_at_10(candidate, *old_eval)
        trial.set_user_attr("new_mrr@10", new)
        trial.set_user_attr("old_mrr@10", old)
        return f_beta(new, old, beta)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=trials)
    best = AdditionParams(**{**asdict(AdditionParams()), **study.best_params})
    history = [{"params": t.params, "value": t.value, **t.user_attrs} for t in study.trials]
    return best, history
