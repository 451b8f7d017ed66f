"""Small helpers shared by the asset modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from model_code.io import tree_sha256

# Steps that change what is deployed (registration, incremental updates) share this pool, limited
# to one step at a time in dagster.yaml: whatever launched them (a sensor's job, "Materialize all",
# `dagster asset materialize`), they never interleave.
DEPLOYMENT_POOL = "fresh_deployment"


def artifact_metadata(path: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Path, content hash and the stage's scalar summary values as asset metadata."""
    metadata: dict[str, Any] = {"path": dg.MetadataValue.path(str(path)), "content_sha256": tree_sha256(path)[:16]}
    for key, value in summary.items():
        if isinstance(value, bool | str):
            metadata[key] = value
        elif isinstance(value, int | float):
            metadata[key] = dg.MetadataValue.float(float(value)) if isinstance(value, float) else value
        elif isinstance(value, dict):
            metadata[key] = dg.MetadataValue.json(value)
    return metadata
