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
next tick. At 100k documents (HNSW) that took the p99 of a search from 46 ms with a 20 ms tick to
30 ms, for 20 % of a core while idle (3 % with 200 ms).

``python -m orchestration.milvus_lite up|down|status [--data-dir D] [--port P] [--engine E]``; ``make milvus-up``,
``make milvus-down`` and the tests use it, and ``make demo`` starts it when ``params.yaml`` selects
``index.backend: milvus`` at a loopback URI (``up --if-params-use-it params.yaml``). The server listens on 127.0.0.1 only; its pid and log are
kept in the data directory, and ``down`` stops that pid and nothing else.
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

from model_code.io import exclusive_lock
from orchestration.signals import default_stop_signals

DEFAULT_DATA_DIR = Path(".cache") / "milvus"
DEFAULT_PORT = 19530
HOST = "127.0.0.1"
ENGINES = ("lite", "standalone")
STANDALONE_TIME_TICK_MS = 10
# milvus-server picks the ports of its parts (the coordinators, etcd's client port) by binding each
# and letting it go before the server takes it: two starting at once can pick the same ones. One
# start at a time on a machine, each until its health check passed (the line milvus-server prints then).
STANDALONE_START_LOCK = Path(tempfile.gettempdir()) / "fresh-retriever-milvus-standalone-start.lock"
STANDALONE_READY = "Ctrl+C to exit"


def _pid_file(data_dir: Path) -> Path:
    return data_dir / "server.pid"


def _answers(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def running_pid(data_dir: Path) -> int | None:
    """The pid of this data directory's server, if that process is alive."""
    pid_file = _pid_file(data_dir)
    if not pid_file.is_file():
        return None
    pid = int(pid_file.read_text().split()[0])
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a server this process started and that exited is reaped (a zombie
    would still answer ``kill 0``)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not our child: another process started it (make milvus-up)
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _command(engine: str, data_dir: Path, port: int, time_tick_ms: int) -> list[str]:
    if engine == "lite":
        return [str(Path(sys.executable).with_name("milvus-lite")), "server", "--data-dir", str(data_dir),
                "--host", HOST, "--port", str(port)]
    if engine != "standalone":
        raise ValueError(f"unknown Milvus engine {engine!r} (use one of {ENGINES})")
    server = Path(sys.executable).with_name("milvus-server")
    if not server.is_file():
        raise RuntimeError(f"{server} is not installed: the standalone engine comes with the PyPI package milvus "
                           "(pip install 'milvus==2.3.5', x86-64 Linux; the dev extra installs it)")
    return [str(server), "--data", str(data_dir / "standalone"), "--proxy-port", str(port),
            "--etcd-port", str(_embedded_etcd(data_dir)), "--extra-config", f"proxy.timeTickInterval={time_tick_ms}"]


def _embedded_etcd(data_dir: Path) -> int:
    """Free ports for the standalone server's embedded etcd, in a config file its ``ETCD_CONFIG_PATH``
    names (``up`` sets it); the client port. milvus-server chooses a free client port itself but
    leaves the peer port at etcd's 2380, so a second server on a machine failed to start."""
    client, peer = _free_port(), _free_port()
    config = data_dir / "embedded-etcd.yaml"
    config.write_text(f"listen-client-urls: http://{HOST}:{client}\nadvertise-client-urls: http://{HOST}:{client}\n"
                      f"listen-peer-urls: http://{HOST}:{peer}\ninitial-advertise-peer-urls: http://{HOST}:{peer}\n"
                      f"initial-cluster: default=http://{HOST}:{peer}\n")
    return client


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def up(data_dir: Path = DEFAULT_DATA_DIR, port: int = DEFAULT_PORT, wait_s: float = 60.0, engine: str = "lite",
       time_tick_ms: int = STANDALONE_TIME_TICK_MS) -> str:
    """Start the ``engine`` server for ``data_dir`` on 127.0.0.1:``port`` (or find it running); its
    URI. ``time_tick_ms``: the standalone server's proxy time tick (what a search waits for)."""
    data_dir = Path(data_dir).resolve()
    uri = f"http://{HOST}:{port}"
    if running_pid(data_dir) is not None:
        return uri
    if _answers(port):
        raise RuntimeError(f"{HOST}:{port} is taken by another process: choose another port (--port)")
    data_dir.mkdir(parents=True, exist_ok=True)
    command = _command(engine, data_dir, port, time_tick_ms)
    log = data_dir / "server.log"
    with exclusive_lock(STANDALONE_START_LOCK) if engine == "standalone" else contextlib.nullcontext():
        logged = log.stat().st_size if log.exists() else 0
        with log.open("ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, "ETCD_CONFIG_PATH": str(data_dir / "embedded-etcd.yaml")},
                                       preexec_fn=default_stop_signals)
        _pid_file(data_dir).write_text(f"{process.pid} {port}\n")
        deadline = time.monotonic() + wait_s
        while not (_answers(port) and (engine == "lite" or STANDALONE_READY in _read_from(log, logged))):
            if process.poll() is not None or time.monotonic() > deadline:
                down(data_dir)
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Milvus {engine} server for {data_dir} did not start on {uri}; {log}:\n{tail}")
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
    the Milvus process it started on SIGINT; a server that outlives ``wait_s`` is killed with its
    process group (its own session: that process and nothing else)."""
    data_dir = Path(data_dir).resolve()
    pid = running_pid(data_dir)
    if pid is not None:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + wait_s
        while running_pid(data_dir) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if running_pid(data_dir) is not None:
            os.killpg(pid, signal.SIGKILL)
    _pid_file(data_dir).unlink(missing_ok=True)
    return pid is not None


def status(data_dir: Path = DEFAULT_DATA_DIR) -> str:
    data_dir = Path(data_dir).resolve()
    pid = running_pid(data_dir)
    if pid is None:
        return f"Milvus server for {data_dir}: not running"
    port = int(_pid_file(data_dir).read_text().split()[1])
    return f"Milvus server for {data_dir}: pid {pid}, http://{HOST}:{port}"


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
