"""`dvc repro` runs the same stages from dvc.yaml + params.yaml (the HCE-J configuration with EM
re-clustering) in a fresh git repository, and after a params change `dvc repro --dry` names only the stages that
depend on it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPOSITORY, tiny_params

PROJECT = REPOSITORY


def run(cmd: list[str], cwd: Path, env: dict) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def dvc_repo(tmp_path: Path, params: dict, tracking_uri: str) -> tuple[Path, dict]:
    """A fresh git + DVC repository holding the project's code, dvc.yaml and ``params``, registering
    into the MLflow store at ``tracking_uri``."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(PROJECT / "dvc.yaml", repo)
    for package in ("model_code", "tracking"):
        shutil.copytree(PROJECT / package, repo / package, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "MLFLOW_TRACKING_URI": tracking_uri,
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    }
    run(["git", "init", "-q"], repo, env)
    run(["dvc", "init", "-q"], repo, env)
    run(["git", "add", "-A"], repo, env)
    run(["git", "commit", "-qm", "init"], repo, env)
    return repo, env


def test_dvc_repro_end_to_end(tmp_path, beir_dir, tiny_model_dir, mlflow_uri):
    """HCE-J with EM rounds and one mined BM25 negative per query, retriever kind incdsi (the kind
    whose index stage does the most: dense index + tuned head), through every stage to registration;
    then a change of the evaluation depth alone would re-run evaluation and registration, nothing upstream."""
    params = tiny_params(beir_dir, tiny_model_dir, train={
        "method": "hce", "max_steps": 4, "data": "joint", "hard_negatives": 1, "mining": {"depth": 10},
        "hce": {"mode": "J", "rounds": 2, "patience": 2, "n_negatives": 2}}, retriever={"kind": "incdsi"})
    repo, env = dvc_repo(tmp_path, params, mlflow_uri)
    out = run(["dvc", "repro"], repo, env)
    for stage in ("ingest", "querygen", "mine-negatives", "cluster", "train", "index", "evaluate", "register"):
        assert f"Running stage '{stage}'" in out
    assert json.loads((repo / "data" / "hard_negatives" / "summary.json").read_text())["queries"] > 0
    assert json.loads((repo / "models" / "retriever" / "manifest.json").read_text())["kind"] == "incdsi"
    assert json.loads((repo / "models" / "retriever" / "head" / "addition.json").read_text())["source"] == "tuned"
    metrics = json.loads((repo / "reports" / "eval" / "metrics.json").read_text())
    assert metrics["queries"] == 12
    assert json.loads((repo / "reports" / "registry" / "registration.json").read_text())["alias"] == "champion"
    assert (repo / "dvc.lock").exists()
    train = json.loads((repo / "reports" / "train" / "metrics.json").read_text())
    assert [r["round"] for r in train["rounds"]] == [0, 1, 2]  # HCE's EM rounds ran inside the train stage
    assert (repo / "models" / "hierarchy_final" / "tree.npz").exists()
    shown = run(["dvc", "metrics", "show", "--json"], repo, env)
    assert "ndcg@10" in shown

    params["eval"]["top_k"] = 20
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    out = run(["dvc", "repro", "--dry"], repo, env)  # what a repro would run, decided as a repro decides it
    for stage in ("evaluate", "register"):
        assert f"Running stage '{stage}'" in out
    for stage in ("ingest", "querygen", "mine-negatives", "cluster", "train", "index"):
        assert f"Running stage '{stage}'" not in out


# both kinds run through the Dagster graph in the fast tier (tests/orchestration/test_definitions.py); through DVC
# they cost eight interpreter start-ups on top (about 100 s of CI), so they run in the slow tier
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bm25", "svdr"])
def test_dvc_repro_of_a_kind_without_a_corpus_tree(tmp_path, beir_dir, tiny_model_dir, kind, mlflow_uri):
    """retriever.kind bm25 or svdr through dvc repro: the cluster stage leaves a not_used stand-in
    (bm25 has no encoder, svdr no tree) and the pipeline still runs to registration. bm25: no
    encoder is trained, the lexical index is built. svdr: the sparse encoder is trained with the
    SVDR loss and the binary token index built from its tokenizer."""
    repo, env = dvc_repo(tmp_path, tiny_params(beir_dir, tiny_model_dir, retriever={"kind": kind}), mlflow_uri)
    out = run(["dvc", "repro"], repo, env)
    assert "Running stage 'register'" in out
    hierarchy = json.loads((repo / "models" / "hierarchy" / "not_used.json").read_text())
    assert hierarchy["reason"].endswith("uses no encoder" if kind == "bm25" else "uses no corpus tree")
    assert json.loads((repo / "models" / "hierarchy_final" / "not_used.json").read_text())["used"] is False
    if kind == "bm25":
        assert json.loads((repo / "models" / "encoder" / "not_used.json").read_text())["used"] is False
    else:
        train = json.loads((repo / "reports" / "train" / "metrics.json").read_text())
        assert train["steps"] == 3
        assert (repo / "models" / "encoder" / "svdr_norms.pt").is_file()
        manifest = json.loads((repo / "models" / "retriever" / "manifest.json").read_text())
        assert manifest["svdr"]["search"] == "beta" and manifest["documents"] == 48
    assert json.loads((repo / "models" / "retriever" / "manifest.json").read_text())["kind"] == kind
    assert json.loads((repo / "reports" / "eval" / "metrics.json").read_text())["queries"] == 12
    registration = json.loads((repo / "reports" / "registry" / "registration.json").read_text())
    assert (registration["retriever"], registration["alias"]) == (kind, "champion")
