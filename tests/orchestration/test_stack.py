"""``orchestration/stack.py``'s own files, without starting the stack (``make test-stack`` runs it):
the PostgreSQL password is private from its first byte and replaced whole, never made again for a
database that has one, and a pid file a kill left empty or a pid that leads no group stops nothing
else and fails nothing."""

import stat
import subprocess

import pytest

from orchestration.stack import Stack, running, stop_process, write_private


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
    other = subprocess.Popen(["sleep", "60"])  # a pid reused by a process that leads no group (ours is its group)
    try:
        (tmp_path / "mlflow.pid").write_text(str(other.pid))
        assert stop_process(stack, "mlflow", grace_s=0) is True and not (tmp_path / "mlflow.pid").exists()
        assert other.poll() is None  # not ours to stop: before, os.killpg raised and `stack down` stopped there
    finally:
        other.kill()
        other.wait()
