"""Pipeline stages, each ``run(params, layout) -> summary``; ``pipeline.STAGES`` lists them once."""

from __future__ import annotations

import json
from pathlib import Path

from model_code.io import atomic_path

NOT_USED_FILE = "not_used.json"


def not_used(directory: Path, reason: str) -> dict:
    """Stand-in output of a stage the configured retriever kind does not need (a BM25 retriever
    has no encoder to cluster with or to train), so DVC and Dagster still see the stage's output
    and a reader of it sees why it is empty."""
    summary = {"used": False, "reason": reason}
    with atomic_path(directory) as out:
        out.mkdir()
        (out / NOT_USED_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary
