"""The run launcher: each run in a local process forked from a warm one, with the run-worker
health check Dagster's run monitoring needs.

**Warm workers.** Dagster's default launcher asks the code server to *spawn* a fresh interpreter
per run, which imports torch, transformers, MLflow, pandas and Dagster again before the first step:
about 5 s of every incremental update's 15 on 2 cores (``benchmarks/results/serving/``). This
launcher runs the same worker (``dagster api execute_run``, what the Docker and Kubernetes
launchers run in their containers) in a process forked from Python's ``forkserver``, which has
imported the heavy third-party libraries (``preload_modules``) once, when the first run launched.
The project's own modules are *not* preloaded: each run imports them afresh, so an edited asset or
stage runs at its next launch, as with the default launcher. A code location whose interpreter is
not this one (another virtual environment) gets a plain ``dagster api execute_run`` process.

**Dead workers.** Dagster finds a run whose worker died (a ``kill -9``, a host crash) through
``RunLauncher.check_run_worker_health``: the run-monitoring daemon calls it for every started
run, marks the run failed when the worker is gone, and then ``run_retries`` launches it again and
the failure sensor records it. The Docker, ECS and Kubernetes launchers implement that check; the
default launcher does not, so a run whose worker was killed stayed ``STARTED`` until
``max_runtime_seconds`` (hours), holding the deployment's concurrency slot and its batch. Here the
worker records its pid when it starts (Dagster's own engine event), the launcher tags each run with
the host it was launched on, and a worker is gone when no process with that pid and a start time
before the run's exists on that host. A run launched on another host is reported as unknown and
left to ``max_runtime_seconds``: several hosts need a launcher with its own health check
(``dagster-docker``, ``dagster-k8s``), which ``dagster.yaml`` can name instead.

**What a worker started.** A worker killed with ``kill -9`` leaves the processes it started running
(the multiprocess executor's step processes, what a step started): they are no longer its children,
and nothing else stops them, so the retry would do their step beside them. Each worker carries its
run's id in ``RUN_ID_ENV``, which what it starts inherits; before a dead worker's run is reported
failed, the processes carrying that id are killed, and cancelling a run interrupts them with the
worker. They are found by that id, not by a process group of the worker's own: workers stay in the
daemon's session, so stopping that session (``stack down``, a crash) still stops every run, and an id
is not reused as a dead worker's pid may be.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import psutil
from dagster import DagsterEventType, DagsterRun, Field
from dagster._core.launcher import LaunchRunContext, RunLauncher
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass, ConfigurableClassData

HOST_TAG = "fresh/run_worker_host"
RUN_ID_ENV = "FRESH_RUN_ID"  # in each run worker's environment, and so in what it starts
_STARTED_PROCESS = "Started process for run"  # the engine event whose metadata carries the worker's pid
_CLOCK_SLACK_SECONDS = 1.0


# What a run of this project imports that takes seconds: loaded once into the fork server. A name
# that does not import is skipped by the fork server (a library not installed costs nothing).
# transformers imports a model's code (and with it torch.distributed, dynamo, sympy: a thousand modules,
# 2 s) when the model is first loaded, so the default encoder's (BERT) is named too.
PRELOAD_MODULES = ("dagster", "numpy", "pandas", "pyarrow", "pandera.pandas", "scipy.stats", "sklearn", "faiss",
                   "torch", "transformers", "transformers.modeling_utils", "transformers.models.bert.modeling_bert",
                   "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
                   "mlflow", "mlflow.pyfunc", "mlflow.store.tracking.sqlalchemy_store",
                   "mlflow.store.model_registry.sqlalchemy_store", "great_expectations")


def run_worker(run_id: str, execute_run_args: str) -> None:
    """A forked run worker: ``dagster api execute_run ARGS`` in this (warm) process. SIGTERM
    interrupts the run as it does the CLI's, so ``terminate`` ends it as cancelled."""
    from dagster._cli.api import api_cli
    from dagster._utils.interrupts import setup_interrupt_handlers

    os.environ[RUN_ID_ENV] = run_id
    setup_interrupt_handlers()
    api_cli.main(args=["execute_run", execute_run_args], prog_name="dagster api", standalone_mode=True)


class LocalRunLauncher(RunLauncher, ConfigurableClass):
    """Runs as local processes forked from a warm one; run monitoring notices dead workers."""

    def __init__(self, inst_data: ConfigurableClassData | None = None,
                 preload_modules: Sequence[str] = PRELOAD_MODULES):
        self._inst_data = inst_data
        self._preload_modules = list(preload_modules)
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {"preload_modules": Field([str], is_required=False, default_value=list(PRELOAD_MODULES),
                                         description="Modules the fork server imports once for every run worker.")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> LocalRunLauncher:
        return cls(inst_data=inst_data, **config_value)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        self._instance.add_run_tags(run.run_id, {HOST_TAG: socket.gethostname()})
        origin = run.job_code_origin
        args = ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=self._instance.get_ref(),
                              set_exit_code_on_failure=True)
        if origin is None or os.path.realpath(origin.executable_path) != os.path.realpath(sys.executable):
            # another interpreter: a cold worker of its own
            subprocess.Popen(args.get_command_args(), env={**os.environ, RUN_ID_ENV: run.run_id})
            return
        server = multiprocessing.get_context("forkserver")
        server.set_forkserver_preload(self._preload_modules)  # read when the fork server starts (first launch)
        server.Process(target=run_worker, args=(run.run_id, args.get_command_args()[-1]),
                       name=f"run {run.run_id[:8]}").start()

    def terminate(self, run_id: str) -> bool:
        """Cancel a run: mark it cancelling, then interrupt its worker and what it started (as
        ``docker stop`` does: a step's own child would outlive the step the worker interrupts)."""
        run = self._instance.get_run_by_id(run_id)
        if not run or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        if self._worker_pid(run_id) is None:  # no worker yet: cancelled now, so the worker starts nothing (before, it
            self._instance.report_run_canceled(run)  # failed on the cancelling status, and run retries relaunched it)
            return True
        _, worker = self._worker(run)
        if worker is None:
            return False
        try:
            worker.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            return False
        _signal([p for p in _started_by(run_id) if p != worker], signal.SIGTERM)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        health = self._worker(run)[0]
        if health.status == WorkerStatus.FAILED:  # before the run is failed and retried
            _signal(_started_by(run.run_id), signal.SIGKILL)
        return health

    def _worker(self, run: DagsterRun) -> tuple[CheckRunHealthResult, psutil.Process | None]:
        """The run's worker process on this host, if it is alive, with the health it implies."""
        host = run.tags.get(HOST_TAG)
        if host != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run worker on host {host!r}, not this one"), None
        pid = self._worker_pid(run.run_id)
        if pid is None:  # not started yet: run monitoring's start timeout covers it
            return CheckRunHealthResult(WorkerStatus.RUNNING, "run worker starting"), None
        record = self._instance.get_run_record_by_id(run.run_id)
        started = record.start_time if record and record.start_time else float("inf")
        try:  # a pid reused by a process that started after the run is not its worker; a zombie has ended
            worker = psutil.Process(pid)
            if worker.create_time() <= started + _CLOCK_SLACK_SECONDS and worker.status() != psutil.STATUS_ZOMBIE:
                return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker pid {pid} alive",
                                            run_worker_id=str(pid)), worker
        except psutil.NoSuchProcess:
            pass
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {pid} on {host} is gone",
                                    run_worker_id=str(pid)), None

    def _worker_pid(self, run_id: str) -> int | None:
        events = self._instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
        for event in reversed(events):
            if event.message.startswith(_STARTED_PROCESS):
                return int(event.dagster_event.engine_event_data.metadata["pid"].value)
        return None


def _started_by(run_id: str) -> list[psutil.Process]:
    """The processes on this host that a run's worker started, and what they started, by the run id
    they inherited (a dead worker's children are no longer its children)."""
    return [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(RUN_ID_ENV) == run_id]


def _signal(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):  # psutil checks the pid was not reused
            process.send_signal(sig)
