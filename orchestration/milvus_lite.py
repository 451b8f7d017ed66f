"""The loopback Milvus Lite server (``milvus-lite server``) that ``index.backend: milvus`` uses when
more than one process reads a collection: a Dagster run worker writing updates and the server that
answers queries. A Milvus Lite ``.db`` file opens in one process only (milvus-io/milvus-lite#264).

``--engine standalone`` starts a Milvus server instead: Milvus 2.3.5 standalone (the server's own Go
and C++ engine, with an embedded etcd and local storage; ``milvus-server`` of the PyPI package
``milvus``, installed by the dev extra on x86-64 Linux), the engine that the ``lite`` one stands in
for. Milvus Lite does per-row Python work on every search (docs/scale.md); a server searches its
indexes. It has no sparse vectors (svdr needs Milvus 2.4 or later). Its proxy syncs time every
``STANDALONE_TIME_TICK_MS`` instead of Milvus's 200 ms: the store's searches are strongly
consistent (an update is seen by every server the moment it is written), and each waits for the
next tick. At 100k documents (HNSW, one trial each) the p99 of a search was 46 ms with a 20 ms tick
and 30 ms with 10 ms (38 and 29 ms in the two committed benchmark runs), for 20 % of a core while idle (3 %
with Milvus's 200 ms, at which a search took 200 ms at the median).

``python -m orchestration.milvus_lite up|down|status [--data-dir D] [--port P] [--engine E]``; ``make milvus-up``,
``make milvus-down`` and the tests use it, and ``make demo`` starts it when ``params.yaml`` selects
``index.backend: milvus`` at a loopback URI (``up --if-params-use-it params.yaml``). The Lite server
listens on 127.0.0.1 only (the standalone one's proxy on every interface); its pid, port and engine
and its log are kept in the data directory, and ``down`` stops that server and what it started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from model_code.io import atomic_path, exclusive_lock
from orchestration.processes import runs
from orchestration.signals import default_stop_signals

DEFAULT_DATA_DIR = Path(".cache") / "milvus"
DEFAULT_PORT = 19530
HOST = "127.0.0.1"
ENGINES = ("lite", "standalone")
STANDALONE_SERVER = Path(sys.executable).with_name("milvus-server")
STANDALONE_TIME_TICK_MS = 10
STANDALONE_READY = "Ctrl+C to exit"  # what milvus-server prints once its health check passed


def standalone_installed() -> bool:
    return STANDALONE_SERVER.is_file()


def free_port() -> int:
    """A port free on 127.0.0.1 now (a server takes it a moment later)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _pid_file(data_dir: Path) -> Path:
    return data_dir / "server.pid"


def _answers(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _record(data_dir: Path) -> tuple[int, int, str] | None:
    """(pid, port, engine) from the data directory's pid file, or None."""
    pid_file = _pid_file(data_dir)
    if not pid_file.is_file():
        return None
    try:
        pid, port, *engine = pid_file.read_text().split()
        return int(pid), int(port), engine[0] if engine else "lite"
    except ValueError:  # emptied or cut by a kill while it was written: no server is known to run
        return None


def _running(data_dir: Path) -> tuple[int, int, str] | None:
    """(pid, port, engine) of this data directory's server, if that process is alive and is its
    Milvus server (its command line names both: after a reboot the pid may be another program's, or
    another data directory's server's, which ``down`` must not stop)."""
    record = _record(data_dir)
    return record if record is not None and runs(record[0], "milvus", str(data_dir)) else None


def running_pid(data_dir: Path) -> int | None:
    running = _running(data_dir)
    return running[0] if running is not None else None


def _start_lock() -> Path:
    """The lock that keeps a user's starts one at a time, each until its server is up: milvus-server
    picks the ports of its parts (the coordinators, etcd's client port) by binding each and letting
    it go before the server takes it, so two starting at once can pick the same ones; and two starts
    for one data directory would both write its pid file. It lies in a folder of the user's own
    (as tmux's socket does): a lock file one user made in the shared temporary folder, another
    cannot open where ``fs.protected_regular`` is set. Another user's starts are not waited for."""
    folder = Path(tempfile.gettempdir()) / f"fresh-retriever-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.lstat().st_uid != os.getuid():
        raise RuntimeError(f"{folder} belongs to another user: remove it, or set TMPDIR to a folder of your own")
    return folder / "milvus-start.lock"


def _command(engine: str, data_dir: Path, port: int, time_tick_ms: int) -> tuple[list[str], dict[str, str]]:
    """The server's command line and environment."""
    if engine == "lite":
        return [str(Path(sys.executable).with_name("milvus-lite")), "server", "--data-dir", str(data_dir),
                "--host", HOST, "--port", str(port)], dict(os.environ)
    if engine != "standalone":
        raise ValueError(f"unknown Milvus engine {engine!r} (use one of {ENGINES})")
    if not standalone_installed():
        raise RuntimeError(f"{STANDALONE_SERVER} is not installed: the standalone engine comes with the PyPI package "
                           "milvus (pip install 'milvus==2.3.5', x86-64 Linux; the dev extra installs it)")
    # unbuffered: milvus-server prints its ready line with print(), which a log file would hold until it exits
    etcd_config, etcd_port = _embedded_etcd(data_dir)
    environment = {**os.environ, "ETCD_CONFIG_PATH": str(etcd_config), "PYTHONUNBUFFERED": "1"}
    return [str(STANDALONE_SERVER), "--data", str(data_dir / "standalone"), "--proxy-port", str(port),
            "--etcd-port", str(etcd_port), "--extra-config", f"proxy.timeTickInterval={time_tick_ms}"], environment


def _embedded_etcd(data_dir: Path) -> tuple[Path, int]:
    """A config file with free ports for the standalone server's embedded etcd (``ETCD_CONFIG_PATH``
    names it), and its client port. milvus-server chooses a free client port itself but leaves the
    peer port at etcd's 2380, so a second server on a machine failed to start."""
    client, peer = free_port(), free_port()
    config = data_dir / "embedded-etcd.yaml"
    config.write_text(f"listen-client-urls: http://{HOST}:{client}\nadvertise-client-urls: http://{HOST}:{client}\n"
                      f"listen-peer-urls: http://{HOST}:{peer}\ninitial-advertise-peer-urls: http://{HOST}:{peer}\n"
                      f"initial-cluster: default=http://{HOST}:{peer}\n")
    return config, client


def up(data_dir: Path = DEFAULT_DATA_DIR, port: int = DEFAULT_PORT, wait_s: float = 60.0, engine: str = "lite",
       time_tick_ms: int = STANDALONE_TIME_TICK_MS) -> str:
    """Start the ``engine`` server for ``data_dir`` on 127.0.0.1:``port`` (or find it running); its
    URI. ``time_tick_ms``: the standalone server's proxy time tick (what a search waits for)."""
    data_dir = Path(data_dir).resolve()
    with exclusive_lock(_start_lock()):
        if (running := _running(data_dir)) is not None:
            _, running_port, running_engine = running
            if running_engine != engine:
                raise RuntimeError(f"a Milvus {running_engine} server runs for {data_dir} on port {running_port}: stop "
                                   f"it (down) before starting a {engine} one there")
            return f"http://{HOST}:{running_port}"
        uri = f"http://{HOST}:{port}"
        if _answers(port):
            raise RuntimeError(f"{HOST}:{port} is taken by another process: choose another port (--port)")
        data_dir.mkdir(parents=True, exist_ok=True)
        command, environment = _command(engine, data_dir, port, time_tick_ms)
        log = data_dir / "server.log"
        logged = log.stat().st_size if log.exists() else 0
        with log.open("ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       env=environment, preexec_fn=default_stop_signals)
        with atomic_path(_pid_file(data_dir)) as record:  # whole or absent: `down` always finds what to stop
            record.write_text(f"{process.pid} {port} {engine}\n")
        deadline = time.monotonic() + wait_s
        while not (_answers(port) and (engine == "lite" or STANDALONE_READY in _read_from(log, logged))):
            exited, late = process.poll() is not None, time.monotonic() > deadline
            if exited or late:
                answering = _answers(port)
                _stop(data_dir)
                why = ("exited" if exited else f"did not start within {wait_s:g} s" +
                       (" (its port answered, but milvus-server never reported its health check passed)"
                        if answering else ""))
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Milvus {engine} server for {data_dir} on {uri} {why}; {log}:\n{tail}")
            time.sleep(0.1)
    return uri


def _read_from(log: Path, offset: int) -> str:
    with log.open("rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


def down(data_dir: Path = DEFAULT_DATA_DIR, wait_s: float = 20.0) -> bool:
    """Stop the server started for ``data_dir`` (by its pid); whether one was running. SIGINT is
    the server's own stop: it drains its requests and closes its database. SIGTERM ends it without
    the close; a restarted server once failed to open a collection after it ("File is too small:
    0", in a full test run, not reproduced since). The standalone engine's ``milvus-server`` stops
    the Milvus process it started on SIGINT. Whatever of the server's process group is left after
    the wait (``up`` starts each server in a session of its own: the server and what it started)
    is killed. It waits for a start in progress (the user's start lock): stopping a server ``up``
    is still waiting for would fail that start, or remove the pid file of the server it started."""
    data_dir = Path(data_dir).resolve()
    with exclusive_lock(_start_lock()):
        return _stop(data_dir, wait_s)


def _stop(data_dir: Path, wait_s: float = 20.0) -> bool:
    """``down``, under the start lock its caller holds."""
    pid = running_pid(data_dir)
    if pid is not None:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + wait_s
        while running_pid(data_dir) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _pid_file(data_dir).unlink(missing_ok=True)
    return pid is not None


def status(data_dir: Path = DEFAULT_DATA_DIR) -> str:
    data_dir = Path(data_dir).resolve()
    running = _running(data_dir)
    if running is None:
        return f"Milvus server for {data_dir}: not running"
    pid, port, engine = running
    return f"Milvus {engine} server for {data_dir}: pid {pid}, http://{HOST}:{port}"


def loopback_port(params_file: Path) -> int | None:
    """The port of the loopback server ``params_file`` asks for (``index.backend: milvus`` with
    ``index.milvus.uri`` at 127.0.0.1 or localhost), or None: FAISS, a Lite file or a remote server."""
    from urllib.parse import urlsplit

    from model_code.config import load_params

    index = load_params(params_file).index
    uri = urlsplit(index.milvus.uri)
    if index.backend != "milvus" or uri.scheme not in ("http", "tcp") or uri.hostname not in (HOST, "localhost"):
        return None
    return uri.port or DEFAULT_PORT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestration.milvus_lite", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--engine", choices=ENGINES, default="lite", help="up: Milvus Lite, or Milvus 2.3 standalone")
    parser.add_argument("--if-params-use-it", type=Path, metavar="PARAMS",
                        help="up: only when PARAMS select index.backend milvus at a loopback URI (its port)")
    args = parser.parse_args(argv)
    if args.action == "up" and args.if_params_use_it:
        args.port = loopback_port(args.if_params_use_it)
        if args.port is None:
            return 0
    if args.action == "up":
        print(f"Milvus {args.engine} server: {up(args.data_dir, args.port, engine=args.engine)} (data in {args.data_dir})")
    elif args.action == "down":
        print("stopped" if down(args.data_dir) else "no server was running")
    else:
        print(status(args.data_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
