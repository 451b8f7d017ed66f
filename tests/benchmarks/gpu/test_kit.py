"""benchmarks/gpu/wheels.py: the wheels a lent GPU machine needs are the harnesses' dependency
closure, less what its image holds unless pyproject.toml pins it, less PyTorch and orchestration;
benchmarks/gpu/queue.py: the sweeps waiting for a GPU are read from queue.yaml."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import REPOSITORY

WHEELS = REPOSITORY / "benchmarks" / "gpu" / "wheels.py"
QUEUE_PY = WHEELS.with_name("queue.py")


def _needed() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("gpu_wheels", WHEELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.needed()


def test_the_wheel_list_is_the_closure_less_the_image_and_orchestration():
    needed = _needed()
    # pinned with == in pyproject.toml although the image has it: travels, at this environment's version
    assert needed["transformers"] == metadata.version("transformers")
    assert needed["pandas"] == metadata.version("pandas")
    # not declared by the project, only required by a dependency (pydantic): the closure is followed
    assert needed["pydantic-core"] == metadata.version("pydantic-core")
    # on the image and not pinned: the image's own
    assert "numpy" not in needed and "scipy" not in needed and "huggingface-hub" not in needed
    # PyTorch and its CUDA libraries are the image's; orchestration is never imported by a harness
    assert not {"torch", "triton", "mlflow", "dagster", "dvc"} & set(needed)
    assert not any(name.startswith("nvidia-") for name in needed)
    # nothing that only an orchestration package requires (alembic comes with optuna too, so not that)
    assert "dagster-pipes" not in needed and "dvc-data" not in needed


def _queue_module():
    spec = importlib.util.spec_from_file_location("gpu_queue", QUEUE_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_queue_is_data_that_run_sh_runs_when_given_no_command():
    assert "${1:-python3 benchmarks/gpu/queue.py}" in (QUEUE_PY.parent / "run.sh").read_text()
    queue = _queue_module()
    arguments = queue.sweep_arguments({"dataset": "scifact", "seeds": 3, "sweeps": [
        {"name": "s", "base": "svdr-beta", "baseline": "svdr-beta", "seeds": 2, "set": {"train.max_steps": 60},
         "grid": {"retriever.svdr.search": ["beta", "full"], "train.hce.hierarchy_streams": [["supervised"]]}}]},
        Path("/d"), Path("/r"))
    assert arguments == [["--data", "/d/scifact", "--out", "/r", "--name", "s", "--base", "svdr-beta",
                          "--baseline", "svdr-beta", "--seeds", "2",
                          "--grid", 'retriever.svdr.search=["beta", "full"]',
                          "--grid", 'train.hce.hierarchy_streams=[["supervised"]]', "--set", "train.max_steps=60"]]


def test_every_queued_sweep_is_one_the_sweep_harness_accepts(tmp_path, monkeypatch, capsys):
    """Each entry of queue.yaml, as queue.py passes it, gets through benchmarks.sweep's checks (known
    configurations, a grid whose every variant gives valid params, a dataset with test qrels) up to
    the refusal to write uncommitted results, which comes before any run."""
    import yaml

    from benchmarks import run as benchmark_run
    from benchmarks import sweep
    from tests.conftest import write_beir

    write_beir(tmp_path / "scifact")
    monkeypatch.setattr(benchmark_run, "code_version", lambda results=None: "abc1234+dirty")
    queue = _queue_module()
    entries = queue.sweep_arguments(yaml.safe_load(queue.QUEUE.read_text()), tmp_path, benchmark_run.RESULTS)
    assert entries
    for arguments in entries:
        with pytest.raises(SystemExit) as refused:
            sweep.main(arguments)
        assert refused.value.code == 2 and "uncommitted code changes" in capsys.readouterr().err, arguments
