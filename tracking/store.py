"""Where MLflow writes: an embedded SQLite store inside the project unless told otherwise.

``MLFLOW_TRACKING_URI`` (e.g. a tracking server) overrides the default. The experiment's
artifact location is set explicitly, because with a SQLite backend MLflow would otherwise put
artifacts under whatever the current directory happens to be.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import mlflow

_METRIC_NAME = re.compile(r"[^\w.\- /:]")


def default_tracking_uri(root: Path) -> str:
    return f"sqlite:///{(root / 'mlruns' / 'mlflow.db').resolve()}"


def configure(root: Path, experiment: str, tracking_uri: str | None = None) -> str:
    """Point MLflow at the store and make sure ``experiment`` exists; return its id."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    existing = mlflow.get_experiment_by_name(experiment)
    if existing is not None:
        experiment_id = existing.experiment_id
    else:
        location = None
        if uri.startswith("sqlite:///"):
            location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").resolve().as_uri()
        experiment_id = mlflow.create_experiment(experiment, artifact_location=location)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def metric_name(name: str) -> str:
    """MLflow metric keys cannot hold '@': ``ndcg@10`` is logged as ``ndcg_at_10``."""
    return _METRIC_NAME.sub("_", name.replace("@", "_at_"))
