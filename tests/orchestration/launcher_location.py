"""A tiny Dagster code location for the run-launcher test: ``probe`` records which process ran it
and which imported ``tests.orchestration.launcher_preload`` (a module the test asks the fork
server to preload); ``wait`` holds until its file is removed, so the test can cancel it mid-run;
``sleep_in_a_step_process`` runs its op in a process of its own, which waits on a child: what a
dead or cancelled run worker must not leave running."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

OUT = Path(os.environ.get("FRESH_TEST_LAUNCHER_DIR", "."))


@dg.op
def record_process() -> None:
    import tests.orchestration.launcher_preload as preload

    (OUT / f"probe-{os.getpid()}.json").write_text(json.dumps({
        "pid": os.getpid(), "parent": os.getppid(), "preload_imported_by": preload.IMPORTED_BY,
        "executable": sys.executable}))


@dg.op
def hold() -> None:
    (OUT / "holding").write_text(str(os.getpid()))
    while (OUT / "hold").exists():
        time.sleep(0.1)


@dg.op
def sleep_in_a_step() -> None:
    subprocess.Popen(["sleep", "600"]).wait()  # not run(): an interrupted run() kills its child itself


@dg.job(executor_def=dg.in_process_executor)  # as the project's jobs: the op runs in the run worker
def probe():
    record_process()


@dg.job(executor_def=dg.in_process_executor)
def wait():
    hold()


@dg.job(executor_def=dg.multiprocess_executor)  # as full_retrain's: each step in a process the worker starts
def sleep_in_a_step_process():
    sleep_in_a_step()


defs = dg.Definitions(jobs=[probe, wait, sleep_in_a_step_process])
