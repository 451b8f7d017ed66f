"""benchmarks/gpu/wheels.py: the wheels a lent GPU machine needs are the harnesses' dependency
closure, less what its image holds unless pyproject.toml pins it, less PyTorch and orchestration."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

WHEELS = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "wheels.py"


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
