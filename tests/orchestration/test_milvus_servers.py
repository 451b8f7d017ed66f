"""``orchestration.milvus_lite`` starts Milvus standalone servers side by side on one machine (test
workers each start one): both answer, each on its own port, and each stops by its pid."""

import shutil
import threading

import pytest
from pymilvus import MilvusClient

from orchestration import milvus_lite
from tests.conftest import milvus_standalone_installed


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
