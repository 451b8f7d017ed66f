"""The project's Dagster definitions as a code location for the host-crash fault test, with one
hook: while the file named by ``FRESH_TEST_HOLD_FILE`` exists, an incremental update stops in
the middle of its registration (its retriever version written, its MLflow run open, the
deployment lock held) and waits there, so the test can kill every Dagster process at that
moment. Without the variable it is the project's ``defs`` unchanged."""

import os
import time
from pathlib import Path

import tracking.deployment
from orchestration.definitions import defs  # noqa: F401 - the code location's definitions

_hold = os.environ.get("FRESH_TEST_HOLD_FILE")
_log_retriever = tracking.deployment.log_retriever


def _held_log_retriever(*args, **kwargs):
    hold = Path(_hold)
    if hold.exists():
        (hold.parent / "reached").write_text(str(os.getpid()))
        while hold.exists():  # the test kills the host meanwhile
            time.sleep(0.2)
    return _log_retriever(*args, **kwargs)


if _hold:
    tracking.deployment.log_retriever = _held_log_retriever
