"""``orchestration/stack.py``'s own files, without starting the stack (``make test-stack`` runs it):
the PostgreSQL password is private from its first byte and replaced whole, never made again for a
database that has one; a pid file a kill left empty or a pid that leads no group stops nothing
else and fails nothing; a pid that another program has since is no service; one ``up`` or ``down``
runs at a time."""

import stat
import subprocess
import sys
import threading
import time

import psutil
import pytest

from orchestration import stack as stack_module
from orchestration.stack import Stack, down, running, status, stop_postgres, stop_process, up, write_private

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]  # a process whose command line ends as we choose


def sleeper(*args: str, **popen) -> subprocess.Popen:
    """A sleeper already past its exec: until then its command line is this process's, and a pid
    check made in that window judges pytest's command line instead (CI failed on it once)."""
    process = subprocess.Popen([*SLEEPER, *args], **popen)
    deadline = time.monotonic() + 30
    while psutil.Process(process.pid).cmdline() != [*SLEEPER, *args]:
        assert time.monotonic() < deadline, "the sleeper never reached its exec"
        time.sleep(0.01)
    return process


def test_the_password_is_private_kept_and_never_made_again_for_an_existing_database(tmp_path):
    stack = Stack(base=tmp_path / "stack", workspace=tmp_path)
    password = stack.password()
    assert stat.S_IMODE(stack.env_file.stat().st_mode) == 0o600 and stack.password() == password
    write_private(stack.env_file, "export OTHER=1\n")  # an env file a kill left without the line
    assert stat.S_IMODE(stack.env_file.stat().st_mode) == 0o600
    assert [p.name for p in stack.base.iterdir()] == ["env"]  # no temporary file left beside it
    stack.pg_data.mkdir()
    (stack.pg_data / "PG_VERSION").write_text("15\n")
    with pytest.raises(RuntimeError, match="holds no DAGSTER_PG_PASSWORD"):  # before: a new one, which it refused
        stack.password()


def test_an_empty_pid_file_and_a_pid_that_leads_no_group_stop_nothing_else(tmp_path):
    stack = Stack(base=tmp_path, workspace=tmp_path)
    (tmp_path / "mlflow.pid").write_text("")  # a kill between the file's creation and its write
    assert running(stack, "mlflow") is None and stop_process(stack, "mlflow") is False
    other = sleeper("mlflow")  # an mlflow that leads no group (ours is its group)
    try:
        (tmp_path / "mlflow.pid").write_text(str(other.pid))
        assert stop_process(stack, "mlflow", grace_s=0) is True and not (tmp_path / "mlflow.pid").exists()
        assert other.poll() is None  # not ours to stop: before, os.killpg raised and `stack down` stopped there
    finally:
        other.kill()
        other.wait()


def test_a_pid_another_program_has_since_is_no_service_and_is_not_signalled(tmp_path):
    """Before: any live pid was taken as the service's, so after a reboot ``down`` signalled the
    process group of whatever program had the pid since, and ``status`` reported it running."""
    stack = Stack(base=tmp_path, workspace=tmp_path)
    stranger = sleeper(start_new_session=True)  # leads its own group, as a service would
    try:
        (tmp_path / "mlflow.pid").write_text(str(stranger.pid))
        stack.pg_data.mkdir()
        (stack.pg_data / "postmaster.pid").write_text(f"{stranger.pid}\n{stack.pg_data}\n")
        assert running(stack, "mlflow") is None
        assert "mlflow             stopped" in status(stack) and "postgres           stopped" in status(stack)
        assert stop_process(stack, "mlflow", grace_s=0) is False and not (tmp_path / "mlflow.pid").exists()
        assert stop_postgres(stack) is False  # before: pg_ctl stop, which signals the pid in postmaster.pid
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_up_and_down_run_one_at_a_time(tmp_path, monkeypatch):
    """Before: two ``up`` at once each found a service stopped and started it (the second pid file
    replacing the first's), and a ``down`` during an ``up`` could remove the pid file of a server
    the ``up`` had just started. Here each ``up`` or ``down`` takes 0.3 s; started together, none
    begins before the one running ends."""
    steps: list[str] = []

    def step(name: str, result):
        def record(*_args, **_kwargs):
            steps.append(f"{name} begins")
            time.sleep(0.3)
            steps.append(f"{name} ends")
            return result
        return record

    monkeypatch.setattr(stack_module, "up_stores", step("up", None))
    monkeypatch.setattr(stack_module, "up_dagster", lambda stack: {})
    monkeypatch.setattr(stack_module, "stop_process", lambda stack, name: False)
    monkeypatch.setattr(stack_module.milvus_lite, "down", step("down", False))
    monkeypatch.setattr(stack_module, "stop_postgres", lambda stack: False)
    stack = Stack(base=tmp_path, workspace=tmp_path)
    threads = [threading.Thread(target=action, args=(stack,)) for action in (up, up, down)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(steps[0::2]) == ["down begins", "up begins", "up begins"]
    assert [end.replace("ends", "begins") for end in steps[1::2]] == steps[0::2], steps
