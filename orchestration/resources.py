"""Dagster resources: the params file, the workspace layout and the MLflow store.

Resources are immutable configuration holders; they hand out plain objects (``Params``,
``Layout``) so assets can pass them straight to ``model_code``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from model_code.config import Params, load_params
from model_code.layout import Layout


def project_root() -> str:
    """``FRESH_RETRIEVER_ROOT`` if set, else the current directory (where ``dagster dev`` runs)."""
    return os.environ.get("FRESH_RETRIEVER_ROOT", os.getcwd())


class WorkspaceResource(dg.ConfigurableResource):
    """Root directory under which every stage reads and writes (same layout as ``dvc repro``)."""

    root: str = ""

    def layout(self) -> Layout:
        return Layout(self.root or project_root())


class ParamsResource(dg.ConfigurableResource):
    """``params.yaml``: the one configuration source, shared with DVC."""

    path: str = "params.yaml"

    def load(self, workspace: WorkspaceResource, overrides: dict[str, Any] | None = None) -> Params:
        path = Path(self.path)
        if not path.is_absolute():
            path = workspace.layout().root / path
        return load_params(path, overrides)


class MlflowResource(dg.ConfigurableResource):
    """MLflow tracking URI; empty means ``MLFLOW_TRACKING_URI`` or the project's SQLite store."""

    tracking_uri: str = ""


class StageConfig(dg.Config):
    """Per-run overrides of ``params.yaml`` (logged with the run), as a YAML mapping of sections,
    e.g. ``{train: {max_steps: 5}}``. Empty = use params.yaml as is."""

    overrides: str = ""

    def parsed(self) -> dict[str, Any]:
        value = yaml.safe_load(self.overrides) if self.overrides.strip() else {}
        if not isinstance(value, dict):
            raise dg.Failure(f"overrides must be a YAML mapping of params sections, got {value!r}")
        return value
