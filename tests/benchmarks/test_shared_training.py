"""benchmarks.shared_training: configurations that differ only in how they search are trained once,
and each scores exactly what a run of its own would."""

import pytest

from benchmarks import shared_training
from benchmarks.configs import resolve_params
from benchmarks.run import METRICS, run_params
from model_code.stages import train
from tests.conftest import tiny_params


def svdr_params(beir, model, **svdr):
    overrides = tiny_params(beir, model, eval={"metrics": METRICS, "top_k": 100})
    overrides["retriever"] = {**overrides["retriever"], "kind": "svdr", "svdr": {"search": "beta", **svdr}}
    return resolve_params(overrides, beir)


def test_search_modes_trained_once_score_what_each_scores_trained_alone(tmp_path, beir_dir, tiny_model_dir,
                                                                       monkeypatch):
    params = {"beta": svdr_params(beir_dir, tiny_model_dir),
              "full": svdr_params(beir_dir, tiny_model_dir, search="full"),
              "rerank": svdr_params(beir_dir, tiny_model_dir, search="beta_rerank", rerank_depth=3)}
    assert shared_training.training_differences(params) == {}
    trainings, real_train = [], train.run
    monkeypatch.setattr(train, "run", lambda *a: trainings.append(1) or real_train(*a))
    shared = shared_training.run_shared(params, tmp_path / "shared")
    assert len(trainings) == 1  # the encoder was trained by the first configuration only
    for name in ("full", "rerank"):
        alone = run_params(params[name], tmp_path / name)
        metrics, timings, training, per_query, resolved = shared[name]
        assert metrics == pytest.approx(alone[0], abs=1e-9) and per_query.equals(alone[3])
        assert resolved == alone[4] and resolved["retriever"]["svdr"]["search"] == params[name].retriever.svdr.search
        assert timings["train"] == shared["beta"][1]["train"] and set(timings) == set(alone[1])
        assert training["steps"] == alone[2]["steps"] > 0
    assert len(trainings) == 3


def test_configurations_that_train_differently_are_refused_by_name(beir_dir, capsys):
    with pytest.raises(SystemExit) as refused:
        shared_training.main(["--data", str(beir_dir), "--configs", "svdr-full", "svdr-beta", "vdr-full"])
    assert refused.value.code == 2
    assert "vdr-full differs from svdr-full in retriever.svdr.loss, not only in how it searches" in capsys.readouterr().err
