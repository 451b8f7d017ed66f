"""Print ``name==version`` for every distribution the benchmark harnesses need on a lent GPU machine
that its image lacks (one per line), read from this project's installed virtual environment.

A GPU machine here has no network, an image with PyTorch and many libraries, and Python 3.12. The
harnesses run the pipeline stages in process (``model_code`` only: no Dagster, MLflow or DVC), so
they need the project's dependencies less the orchestration ones, and the requirements of those,
recursively, at the versions this environment resolved. A distribution the image holds is left
out unless ``pyproject.toml`` pins it with ``==`` (its behaviour is then part of what a row
measured); PyTorch is always the image's own, with CUDA.

    .venv/bin/python benchmarks/gpu/wheels.py > requirements.txt
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
# Orchestration and tracking: the harnesses never import them (model_code imports none of them).
NOT_NEEDED = {"dagster", "dagster-webserver", "dvc", "mlflow", "hydra-core", "omegaconf", "antlr4-python3-runtime"}
ALWAYS_THE_IMAGES = {"torch", "triton"}  # and every nvidia-* CUDA library
TARGET = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
          "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}


def image_packages() -> set[str]:
    lines = (HERE / "image-packages.txt").read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line.strip() and not line.startswith("#")}


def needed() -> dict[str, str]:
    """name -> installed version for the closure of the project's needed dependencies."""
    declared = [Requirement(r) for r in tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]]
    pinned = {canonicalize_name(r.name) for r in declared if any(s.operator == "==" for s in r.specifier)}
    image = image_packages()
    todo = [canonicalize_name(r.name) for r in declared if canonicalize_name(r.name) not in NOT_NEEDED]
    seen: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in seen or name in ALWAYS_THE_IMAGES or name.startswith("nvidia-"):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            sys.exit(f"{name} is not installed in this environment: run `make install` first")
        seen[name] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({**TARGET, "extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return {name: version for name, version in sorted(seen.items()) if name not in image or name in pinned}


if __name__ == "__main__":
    for name, version in needed().items():
        print(f"{name}=={version}")
