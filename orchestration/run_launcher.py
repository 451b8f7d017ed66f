"""Dagster's default run launcher, plus the run-worker health check its run monitoring needs.

Dagster finds a run whose worker died (a ``kill -9``, a host crash) through
``RunLauncher.check_run_worker_health``: the run-monitoring daemon calls it for every started
run, marks the run failed when the worker is gone, and then ``run_retries`` launches it again and
the failure sensor records it. The Docker, ECS and Kubernetes launchers implement that check; the
default launcher, which runs workers as local processes, does not, so a run whose worker was
killed stayed ``STARTED`` until ``max_runtime_seconds`` (hours), holding the deployment's
concurrency slot and its batch. This launcher is the default one with that check: the worker
records its pid when it starts (Dagster's own engine event), the launcher tags each run with the
host it was launched on, and a worker is gone when no process with that pid and a start time
before the run's exists on that host. A run launched on another host is reported as unknown and
left to ``max_runtime_seconds``: several hosts need a launcher with its own health check
(``dagster-docker``, ``dagster-k8s``), which ``dagster.yaml`` can name instead.
"""

from __future__ import annotations

import socket

import psutil
from dagster import DagsterEventType, DagsterRun
from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus

HOST_TAG = "fresh/run_worker_host"
_STARTED_PROCESS = "Started process for run"  # the engine event whose metadata carries the worker's pid
_CLOCK_SLACK_SECONDS = 1.0


class LocalRunLauncher(DefaultRunLauncher):
    """``DefaultRunLauncher`` whose run monitoring notices dead local run workers."""

    def launch_run(self, context: LaunchRunContext) -> None:
        self._instance.add_run_tags(context.dagster_run.run_id, {HOST_TAG: socket.gethostname()})
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        host = run.tags.get(HOST_TAG)
        if host != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run worker on host {host!r}, not this one")
        pid = self._worker_pid(run.run_id)
        if pid is None:  # not started yet: run monitoring's start timeout covers it
            return CheckRunHealthResult(WorkerStatus.RUNNING, "run worker starting")
        record = self._instance.get_run_record_by_id(run.run_id)
        started = record.start_time if record and record.start_time else float("inf")
        try:  # a pid reused by a process that started after the run is not its worker
            alive = psutil.Process(pid).create_time() <= started + _CLOCK_SLACK_SECONDS
        except psutil.NoSuchProcess:
            alive = False
        if alive:
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker pid {pid} alive", run_worker_id=str(pid))
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {pid} on {host} is gone",
                                    run_worker_id=str(pid))

    def _worker_pid(self, run_id: str) -> int | None:
        events = self._instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
        for event in reversed(events):
            if event.message.startswith(_STARTED_PROCESS):
                return int(event.dagster_event.engine_event_data.metadata["pid"].value)
        return None
