"""``orchestration.milvus_lite`` starts Milvus standalone servers side by side on one machine (test
workers each start one): both answer, each on its own port, and each stops by its pid. Its start
lock lies in a folder of the user's own."""

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from pymilvus import MilvusClient

from orchestration import milvus_lite
from tests.conftest import milvus_standalone_installed
from tests.helpers.waiting import wait_until


@milvus_standalone_installed
def test_two_standalone_servers_started_at_once_both_answer(tmp_path, monkeypatch):
    """Before: the second server's embedded etcd found its peer port (2380) taken and the server
    died ("Milvus server already stopped"). Without PYTHONUNBUFFERED in the environment (this
    machine sets it; a shell need not), milvus-server's ready line must still reach its log."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    folders = [tmp_path / "a", tmp_path / "b"]
    ports = [milvus_lite.free_port() for _ in folders]
    uris: dict[int, str] = {}
    errors: list[str] = []

    def start(i: int) -> None:
        try:
            uris[i] = milvus_lite.up(folders[i], ports[i], engine="standalone", time_tick_ms=200)
        except RuntimeError as error:
            errors.append(str(error)[-1500:])

    try:
        starts = [threading.Thread(target=start, args=(i,)) for i in range(2)]
        for thread in starts:
            thread.start()
        for thread in starts:
            thread.join()
        assert not errors, errors
        versions = [MilvusClient(uri=uris[i]).get_server_version() for i in range(2)]
        assert versions == ["v2.3.5-lite"] * 2
        with pytest.raises(RuntimeError, match="a Milvus standalone server runs for .* stop it"):
            milvus_lite.up(folders[0], ports[0])  # the Lite engine asked for where a standalone one runs
    finally:
        stopped = [milvus_lite.down(folder) for folder in folders]
        for folder in folders:
            shutil.rmtree(folder / "standalone", ignore_errors=True)  # the server's unpacked binaries: about 250 MB
    assert stopped == [True, True] and all(milvus_lite.running_pid(folder) is None for folder in folders)


def test_a_pid_file_a_kill_left_empty_or_cut_is_no_server(tmp_path):
    """Before: ``up``, ``down`` and ``status`` all failed on it (ValueError), so the tool could stop nothing."""
    for text in ("", "12345"):
        milvus_lite._pid_file(tmp_path).write_text(text)
        assert milvus_lite.running_pid(tmp_path) is None


def test_a_pid_another_data_directorys_server_has_since_is_not_this_ones(tmp_path):
    """Before: any process with "milvus" in its command line was taken as the pid file's server, so
    after a reboot ``down`` of one data directory could stop another's server that got the pid."""
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "milvus-lite", "--data-dir",
                              str(tmp_path / "other")])
    try:  # until it runs its own command line, not the forked test's
        wait_until(lambda: b"milvus-lite" in Path(f"/proc/{other.pid}/cmdline").read_bytes(), "the stand-in's exec", 30)
        (tmp_path / "mine").mkdir()
        milvus_lite._pid_file(tmp_path / "mine").write_text(f"{other.pid} 19530 lite")
        assert milvus_lite.running_pid(tmp_path / "mine") is None
        assert not milvus_lite.down(tmp_path / "mine") and other.poll() is None  # not signalled
        (tmp_path / "other").mkdir()
        milvus_lite._pid_file(tmp_path / "other").write_text(f"{other.pid} 19530 lite")
        assert milvus_lite.running_pid(tmp_path / "other") == other.pid  # its own data directory's: it is
    finally:
        other.kill()
        other.wait()


class _Locked(Exception):
    pass


def test_the_start_lock_lies_in_a_folder_of_the_users_own(tmp_path, monkeypatch):
    """Before: one lock file in the shared temporary folder for every user; where fs.protected_regular
    is set (systemd's default), a second user could not open the file the first had made, and so
    could start no server."""
    def lock(path, waiting=None):
        raise _Locked(path)  # the lock ``up`` takes; ``up`` goes no further

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(milvus_lite, "exclusive_lock", lock)
    with pytest.raises(_Locked) as locked:
        milvus_lite.up(tmp_path / "server", milvus_lite.free_port())
    folder = Path(locked.value.args[0]).parent
    assert folder.stat().st_uid == os.getuid() and not folder.stat().st_mode & 0o022  # no one else writes there


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root")
def test_a_lock_folder_another_user_made_is_a_clear_error(tmp_path, monkeypatch):
    """A folder of that name that another user made first (which would let them remove or hold the
    lock) fails ``up`` with what to do; no lock is taken in it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"fresh-retriever-{os.getuid()}"
    planted.mkdir(mode=0o777)
    os.chown(planted, 65534, 65534)
    try:
        with pytest.raises(RuntimeError, match="belongs to another user: remove it, or set TMPDIR"):
            milvus_lite.up(tmp_path / "server", milvus_lite.free_port())
    finally:
        os.chown(planted, os.getuid(), os.getgid())  # ours again, so that down can take the lock
        milvus_lite.down(tmp_path / "server")  # what a start that went on would have left running


def test_a_stop_waits_for_a_start_in_progress(tmp_path, monkeypatch):
    """Before: ``down`` took no lock, so a ``down`` while an ``up`` waited for its server to answer
    stopped that server (the start then failed) or removed the pid file of the one just started.
    Here a start holds the user's start lock for 0.5 s; a ``down`` begun meanwhile ends after it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    steps, holding = [], threading.Event()

    def start():
        with milvus_lite.exclusive_lock(milvus_lite._start_lock()):
            holding.set()
            time.sleep(0.5)
            steps.append("start ends")

    starting = threading.Thread(target=start)
    starting.start()
    holding.wait(10)
    assert milvus_lite.down(tmp_path / "server") is False  # nothing ran there
    steps.append("down ends")
    starting.join()
    assert steps == ["start ends", "down ends"]
