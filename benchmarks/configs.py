"""Named benchmark configurations, read from ``benchmarks/configs/<name>.yaml``.

A configuration is a set of ``params.yaml`` overrides that the pipeline's own stages run on a BEIR
dataset, so a benchmark measures exactly the code users run. A file holds those overrides and may
name ``base:``, a configuration it extends (the base's overrides deep-merged under its own, base of
base included), and ``seeds:``, how many training seeds it is meant to be run with: ``<name>-seed<s>``
(s = 1 .. seeds - 1) is the configuration with every training seed set to s, the runs that
``benchmarks.compare`` averages query by query (``name+name-seed1+name-seed2``). ``seeds`` belongs to
its file only: a configuration extending another does not inherit it. Files whose name starts with
``_`` are bases only, not configurations. Why each configuration exists and what it measured is
data too: ``benchmarks/notes/configurations.md``.

Rows record the params their configuration resolved to; ``benchmarks.provenance`` re-resolves the
name through this module and compares, so editing one file touches only the rows of the
configurations read from it (``config_files``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from model_code.config import Params, deep_merge, load_params

PARAMS_FILE = Path(__file__).resolve().parents[1] / "params.yaml"
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
_SEEDED = re.compile(r"(?P<name>.+)-seed(?P<seed>[1-9][0-9]*)")
_KEYS = ("base", "seeds")  # what a file holds beside its params overrides


def resolve_params(overrides: dict[str, Any], data_dir: Path) -> Params:
    """``params.yaml`` with a configuration's ``overrides`` and the BEIR directory ``data_dir``: what
    a run of that configuration uses, and what its results row records (``params``)."""
    return load_params(PARAMS_FILE, deep_merge(overrides, {"data": {"source": "beir", "path": str(data_dir)}}))


def seed_overrides(seed: int) -> dict[str, Any]:
    """Seed 0 is a configuration as it is; seed s sets every seed of training to s (ICT spans, tree
    k-means, batch order, sampled negatives), while the data and the dev split stay fixed, so the
    runs differ only by chance."""
    return {} if seed == 0 else {"querygen": {"seed": seed}, "hierarchy": {"seed": seed}, "train": {"seed": seed}}


def _read(directory: Path, stem: str) -> dict[str, Any]:
    return yaml.safe_load((directory / f"{stem}.yaml").read_text()) or {}


def _source(name: str, directory: Path) -> tuple[str, int] | None:
    """The file stem and seed a configuration name is read from; None when there is no such name."""
    if not name.startswith("_") and (directory / f"{name}.yaml").is_file():
        return name, 0
    seeded = _SEEDED.fullmatch(name)
    if seeded is None or (source := _source(seeded["name"], directory)) is None or source[1]:
        return None
    seed = int(seeded["seed"])
    return (source[0], seed) if seed < _read(directory, source[0]).get("seeds", 1) else None


def config_files(name: str, directory: Path = CONFIG_DIR) -> list[Path] | None:
    """The files configuration ``name`` is read from, its own first, then its bases'; None when
    there is no such configuration."""
    source = _source(name, directory)
    if source is None:
        return None
    files, stem = [], source[0]
    while stem is not None:
        path = directory / f"{stem}.yaml"
        if path in files:
            raise ValueError(f"{name}: its bases loop back to {path.name}")
        files.append(path)
        stem = _read(directory, stem).get("base")
    return files


def config_overrides(name: str, directory: Path = CONFIG_DIR) -> dict[str, Any] | None:
    """The ``params.yaml`` overrides configuration ``name`` runs with (None: no such configuration)."""
    files = config_files(name, directory)
    if files is None:
        return None
    merged: dict[str, Any] = {}
    for path in reversed(files):
        merged = deep_merge(merged, {k: v for k, v in _read(directory, path.stem).items() if k not in _KEYS})
    return deep_merge(merged, seed_overrides(_source(name, directory)[1]))


def config_names(directory: Path = CONFIG_DIR) -> list[str]:
    """Every configuration name: each file's and its ``-seed<s>`` reruns."""
    stems = sorted(path.stem for path in directory.glob("*.yaml") if not path.stem.startswith("_"))
    return [f"{stem}-seed{s}" if s else stem for stem in stems for s in range(_read(directory, stem).get("seeds", 1))]


PIPELINE_CONFIGS: dict[str, dict[str, Any]] = {name: config_overrides(name) for name in config_names()}
CONFIGS = list(PIPELINE_CONFIGS)
# the HCE-J branching sweep (benchmarks/branching.py): the b of every hce-j-b<b> configuration
BRANCHING_SWEEP = sorted(int(match[1]) for name in CONFIGS if (match := re.fullmatch(r"hce-j-b(\d+)", name)))
