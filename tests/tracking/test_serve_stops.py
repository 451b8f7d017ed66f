"""``fresh-registry serve`` execs the server with SIGTERM and SIGINT at their defaults: a parent that
ignores them (in the full test run a worker was found ignoring SIGTERM, and every server it started
outlived its test) no longer passes that on, so ``terminate`` stops the server."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPOSITORY

SCRIPT = """
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent's disposition, inherited by what it execs
signal.signal(signal.SIGINT, signal.SIG_IGN)
if sys.argv[1] == "stoppable":
    from tracking.cli import exec_stoppable
    exec_stoppable(["/bin/sleep", "60"], dict(os.environ))
os.execve("/bin/sleep", ["/bin/sleep", "60"], dict(os.environ))
"""


@pytest.mark.parametrize(("how", "stops"), [("stoppable", True), ("plain", False)])
def test_a_server_started_by_a_parent_ignoring_sigterm_still_stops_on_it(how, stops):
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, how], cwd=REPOSITORY)
    try:
        deadline = time.monotonic() + 120  # importing tracking.cli (MLflow) takes seconds on a loaded machine
        comm = Path(f"/proc/{process.pid}/comm")
        while comm.read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.1)  # until the exec happened: the process is sleep
        assert comm.read_text().strip() == "sleep"
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        assert (code == -signal.SIGTERM) if stops else code is None  # plain exec: the ignored TERM was inherited
    finally:
        process.kill()
        process.wait()


def test_a_milvus_lite_server_started_by_a_parent_ignoring_sigterm_stops_on_it(tmp_path):
    """``milvus_lite.up`` from a process ignoring SIGTERM and SIGINT (as a background shell ignores
    SIGINT): the server it leaves running ignores neither, and stops on ``down``'s SIGINT (before,
    ``down`` waited 20 s and killed it)."""
    import socket

    from orchestration import milvus_lite

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    starter = ("import signal\n"
               "for ignored in (signal.SIGTERM, signal.SIGINT): signal.signal(ignored, signal.SIG_IGN)\n"
               f"from orchestration import milvus_lite; milvus_lite.up({str(tmp_path / 'server')!r}, {port})")
    subprocess.run([sys.executable, "-c", starter], cwd=REPOSITORY, check=True, timeout=120)
    pid = milvus_lite.running_pid(tmp_path / "server")
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        ignored = int(next(line.split()[1] for line in status if line.startswith("SigIgn")), 16)
        assert not ignored & ((1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1)))
        start = time.monotonic()
        assert milvus_lite.down(tmp_path / "server", wait_s=20)
        assert time.monotonic() - start < 15 and milvus_lite.running_pid(tmp_path / "server") is None
    finally:
        milvus_lite.down(tmp_path / "server", wait_s=1)
