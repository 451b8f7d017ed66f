"""The run launcher with the real ``dagster-daemon``: runs are forked from one warm process that
imported the preloaded modules once (observed from the workers: their parent process and who
imported the probe module), a run still succeeds, and ``terminate`` cancels a running one."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import dagster as dg
import psutil
import yaml

from tests.conftest import REPOSITORY
from tests.helpers.waiting import wait_until

BIN = Path(sys.executable).parent
LOCATION = ["-m", "tests.orchestration.launcher_location"]
PATIENCE = 180  # seconds for each thing the daemon or a run worker does


def test_runs_are_forked_from_one_warm_process_and_a_running_one_can_be_cancelled(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    config = yaml.safe_load((REPOSITORY / "orchestration" / "dagster.yaml").read_text())
    config["run_launcher"]["config"] = {"preload_modules": ["dagster", "tests.orchestration.launcher_preload"]}
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "DAGSTER_HOME": str(home), "FRESH_TEST_LAUNCHER_DIR": str(tmp_path),
           "PYTHONPATH": str(REPOSITORY)}
    with dg.DagsterInstance.from_config(str(home)):
        pass  # the instance exists before the daemon and the CLI open it
    daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", *LOCATION], cwd=REPOSITORY, env=env,
                              stdout=(tmp_path / "daemon.log").open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        for _ in range(2):
            subprocess.run([str(BIN / "dagster"), "job", "launch", *LOCATION, "-j", "probe"], cwd=REPOSITORY, env=env,
                           check=True, capture_output=True)
        probes = wait_until(lambda: len(found := sorted(tmp_path.glob("probe-*.json"))) == 2 and found,
                            "both probe runs", PATIENCE)
        records = [json.loads(p.read_text()) for p in probes]
        server = {r["parent"] for r in records}
        assert len(server) == 1, records  # both workers forked from one process ...
        [server_pid] = server
        assert server_pid != daemon.pid and "forkserver" in " ".join(psutil.Process(server_pid).cmdline())
        # ... which imported the preloaded module once, before either worker existed
        assert {r["preload_imported_by"] for r in records} == {server_pid}
        assert {r["pid"] for r in records}.isdisjoint({server_pid})

        (tmp_path / "hold").touch()
        subprocess.run([str(BIN / "dagster"), "job", "launch", *LOCATION, "-j", "wait"], cwd=REPOSITORY, env=env,
                       check=True, capture_output=True)
        worker = int(wait_until(lambda: (tmp_path / "holding").exists() and (tmp_path / "holding").read_text(),
                                "the wait run to start", PATIENCE))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            [run] = instance.get_runs(dg.RunsFilter(job_name="wait"))
            assert instance.run_launcher.terminate(run.run_id)
            wait_until(lambda: instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED,
                       "the run to be cancelled", PATIENCE)
            # the worker marks its run cancelled from its SIGTERM handler, then unwinds and exits
            wait_until(lambda: _exited(worker), "the cancelled run's worker to exit", PATIENCE)
            statuses = {r.job_name: r.status for r in instance.get_runs() if r.job_name == "probe"}
            assert statuses == {"probe": dg.DagsterRunStatus.SUCCESS}
    finally:
        os.killpg(daemon.pid, 9)
        daemon.wait()


def _exited(pid: int) -> bool:
    """Whether the process has ended (gone, or a zombie its parent has not reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _launcher_instance():
    return dg.instance_for_test(overrides={"run_launcher": {"module": "orchestration.run_launcher",
                                                            "class": "LocalRunLauncher",
                                                            "config": {"preload_modules": ["dagster"]}}})


def test_a_run_cancelled_before_its_worker_started_is_cancelled_not_failed():
    """Before: it was left CANCELING, its worker then failed on that status, and the run retries
    relaunched the run the user had cancelled."""
    from orchestration.run_launcher import HOST_TAG

    with _launcher_instance() as instance:
        run = instance.create_run_for_job(dg.JobDefinition(name="job", graph_def=dg.GraphDefinition("job")),
                                          status=dg.DagsterRunStatus.STARTING, tags={HOST_TAG: socket.gethostname()})
        assert instance.run_launcher.terminate(run.run_id)
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED


def test_a_worker_that_ended_as_a_zombie_is_gone():
    """Before: a worker killed with kill -9 and not reaped (a zombie) read as alive, and its run held
    the deployment's slot for max_runtime_seconds (6 h)."""
    from dagster._core.events import EngineEventData
    from dagster._core.launcher import WorkerStatus

    from orchestration.run_launcher import _STARTED_PROCESS, HOST_TAG

    ended = subprocess.Popen(["true"])  # never waited for: a zombie once it exits
    wait_until(lambda: psutil.Process(ended.pid).status() == psutil.STATUS_ZOMBIE, "the child to end", 30)
    with _launcher_instance() as instance:
        run = instance.create_run_for_job(dg.JobDefinition(name="job", graph_def=dg.GraphDefinition("job")),
                                          status=dg.DagsterRunStatus.STARTED, tags={HOST_TAG: socket.gethostname()})
        instance.report_engine_event(f"{_STARTED_PROCESS} (pid: {ended.pid}).", run,
                                     EngineEventData(metadata={"pid": dg.MetadataValue.int(ended.pid)}))
        health = instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run.run_id))
        assert health.status == WorkerStatus.FAILED, health.msg
    ended.wait()


def _sleeping_in_a_step_process(instance):
    """A run of ``sleep_in_a_step_process`` launched by the launcher (in this test's fork server),
    once its op runs: the run, its worker and what the worker started (the step process, its
    ``sleep``, multiprocessing's resource tracker)."""
    from dagster._core.launcher import LaunchRunContext

    from tests.orchestration.launcher_location import sleep_in_a_step_process

    origin = dg.reconstructable(sleep_in_a_step_process).get_python_origin()
    run = instance.create_run_for_job(sleep_in_a_step_process, status=dg.DagsterRunStatus.STARTING,
                                      job_code_origin=origin)
    instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))

    def started():
        pid = instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run.run_id)).run_worker_id
        children = psutil.Process(int(pid)).children(recursive=True) if pid else []
        return any(c.cmdline() == ["sleep", "600"] for c in children) and (psutil.Process(int(pid)), children)

    worker, children = wait_until(started, "the run's op to start its sleep", PATIENCE)
    return run, worker, children


def _kill(processes):
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def test_what_a_killed_worker_started_is_killed_before_its_run_is_reported_failed():
    """Before: a worker killed with kill -9 left its step processes running (they are no longer its
    children, nothing stopped them), so the retry that run_retries launched on the failure did the
    same step beside them."""
    from dagster._core.launcher import WorkerStatus

    with _launcher_instance() as instance:
        run, worker, children = _sleeping_in_a_step_process(instance)
        try:
            worker.kill()
            wait_until(lambda: _exited(worker.pid), "the worker to die", PATIENCE)
            health = instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run.run_id))
            assert health.status == WorkerStatus.FAILED, health.msg
            wait_until(lambda: all(_exited(c.pid) for c in children), "what the dead worker started to die", 10)
        finally:
            _kill([worker, *children])


def test_cancelling_a_run_interrupts_what_its_worker_started():
    """Before: only the worker was signalled; it interrupted its step, and the step's own child
    process ran on."""
    with _launcher_instance() as instance:
        run, worker, children = _sleeping_in_a_step_process(instance)
        try:
            assert instance.run_launcher.terminate(run.run_id)
            wait_until(lambda: instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED,
                       "the run to be cancelled", PATIENCE)
            wait_until(lambda: all(_exited(p.pid) for p in [worker, *children]), "the run's processes to end", 10)
        finally:
            _kill([worker, *children])
