"""The production stack on one machine (``make stack``): PostgreSQL, the Dagster daemon and
webserver on PostgreSQL storage, the MLflow tracking server on PostgreSQL with a proxied artifact
store, and the loopback Milvus Lite server; ``make stack-down`` stops each by its own pid,
``make stack-status`` says what runs where.

    python -m orchestration.stack up|down|status [--dir .stack] [--workspace .]

Everything lives in one git-ignored folder (``.stack/``): the PostgreSQL cluster, the Dagster
instance, MLflow's artifacts, Milvus's data, each service's log and pid, and ``env`` (the
variables a shell sources to use the stack: ``DAGSTER_HOME``, ``MLFLOW_TRACKING_URI``,
``DAGSTER_PG_PASSWORD``). Every service listens on 127.0.0.1 only. PostgreSQL authenticates TCP
connections by password (scram-sha-256, a random password made at the first ``up`` and kept in
``env``, mode 600) and its socket by peer; it never trusts a network address. It runs as the
``postgres`` system user when started by root, as PostgreSQL refuses root. The same params.yaml
and Definitions run against this stack as against the embedded SQLite one: only the Dagster
instance file and the tracking URI differ.

One ``up`` or ``down`` of a stack runs at a time (a lock in its folder). A pid is taken as a
service's only while that process's command line is the service's (its program, or for PostgreSQL
its data directory): a pid file that outlived its process (a reboot, a kill -9) may name a pid
another program has since, which ``down`` must not signal nor ``status`` report as the service.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from model_code.io import atomic_path, exclusive_lock
from orchestration import milvus_lite
from orchestration.processes import alive, runs
from orchestration.signals import default_stop_signals

REPOSITORY = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    postgres: int = 55432
    mlflow: int = 5050
    dagster: int = 3030
    milvus: int = 19530


@dataclass(frozen=True)
class Stack:
    """The stack kept in ``base`` (its files) for the workspace ``workspace``."""

    base: Path
    workspace: Path
    ports: Ports = Ports()
    definitions: str = "orchestration.definitions"  # the code location the daemon and webserver load
    monitoring_poll_s: int | None = None  # run monitoring's poll interval (None: orchestration/dagster.yaml's)

    @property
    def pg_data(self) -> Path:
        return self.base / "postgres"

    @property
    def dagster_home(self) -> Path:
        return self.base / "dagster"

    @property
    def env_file(self) -> Path:
        return self.base / "env"

    @property
    def tracking_uri(self) -> str:
        return f"http://{HOST}:{self.ports.mlflow}"

    def password(self) -> str:
        """The PostgreSQL password: made at the first call and kept in ``env`` (mode 600). Once the
        database exists a lost password is an error, never a new one the database would refuse."""
        if self.env_file.is_file():
            for line in self.env_file.read_text().splitlines():
                if line.startswith("export DAGSTER_PG_PASSWORD="):
                    return line.split("=", 1)[1]
        if (self.pg_data / "PG_VERSION").is_file():
            raise RuntimeError(f"{self.env_file} holds no DAGSTER_PG_PASSWORD, and the database in {self.pg_data} "
                               "was made with one: write the line back (export DAGSTER_PG_PASSWORD=...)")
        password = secrets.token_urlsafe(24)
        write_private(self.env_file, f"export DAGSTER_PG_PASSWORD={password}\n")
        return password

    def database_uri(self, database: str) -> str:
        return f"postgresql+psycopg2://fresh:{self.password()}@{HOST}:{self.ports.postgres}/{database}"

    def service_env(self) -> dict[str, str]:
        """The environment of the Dagster processes (and what ``env`` exports)."""
        return {"DAGSTER_HOME": str(self.dagster_home), "MLFLOW_TRACKING_URI": self.tracking_uri,
                "DAGSTER_PG_PASSWORD": self.password(), "FRESH_RETRIEVER_ROOT": str(self.workspace),
                "PYTHONPATH": str(REPOSITORY)}


def _run_as_postgres(command: list[str], what: str) -> None:
    """``command`` as the ``postgres`` user when this process is root (PostgreSQL refuses root); a
    failure names ``what`` with the command's own message."""
    done = subprocess.run(["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"PostgreSQL: {what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if found is None:
        raise RuntimeError(f"{name} not found: install PostgreSQL (Debian: apt-get install postgresql)")
    return str(found)


def _owned_by_postgres(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def start_postgres(stack: Stack) -> None:
    """Initialise the cluster on first use (password auth on TCP, peer on the socket), start it on
    127.0.0.1, and create the ``dagster`` and ``mlflow`` databases."""
    data, run = stack.pg_data, stack.base / "postgres-run"
    if os.geteuid() == 0:  # the postgres user must reach its folders
        closed = [p for p in data.resolve().parents if p.exists() and not p.stat().st_mode & 0o001]
        if closed:
            raise RuntimeError(f"PostgreSQL runs as the postgres user, who cannot enter {closed[0]} (mode "
                               f"{oct(closed[0].stat().st_mode & 0o777)}): put the stack's folder (--dir) elsewhere")
    for folder in (data, run):
        _owned_by_postgres(folder)
    if not (data / "PG_VERSION").is_file():
        password_file = run / "initial-password"
        write_private(password_file, stack.password() + "\n")  # readable by its owner only, and gone after initdb
        try:
            if os.geteuid() == 0:
                shutil.chown(password_file, "postgres", "postgres")
            _run_as_postgres([_pg_bin("initdb"), "-D", str(data), "-U", "fresh", f"--pwfile={password_file}",
                              "--auth-local=peer", "--auth-host=scram-sha-256"], "initdb")
        finally:
            password_file.unlink(missing_ok=True)
    if _postgres_pid(stack) is None:
        options = f"-p {stack.ports.postgres} -c listen_addresses={HOST} -c unix_socket_directories={run}"
        _run_as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-l", str(run / "postgres.log"), "-w", "-o", options,
                          "start"], f"starting (log: {run / 'postgres.log'})")
    import psycopg2

    connection = psycopg2.connect(host=HOST, port=stack.ports.postgres, user="fresh", password=stack.password(),
                                  dbname="postgres")
    connection.autocommit = True
    with connection.cursor() as cursor:
        for database in ("dagster", "mlflow"):
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if cursor.fetchone() is None:
                cursor.execute(f"CREATE DATABASE {database}")
    connection.close()


def _postgres_pid(stack: Stack) -> int | None:
    """The postmaster's pid, if it runs on this stack's data directory. A stale ``postmaster.pid``
    is left for PostgreSQL to judge at its next start: removing it beside a live postmaster would
    lift the interlock that keeps a second one off the same data."""
    pid_file = stack.pg_data / "postmaster.pid"
    if not pid_file.is_file():
        return None
    pid = int(pid_file.read_text().split()[0])
    return pid if runs(pid, str(stack.pg_data)) else None


def stop_postgres(stack: Stack) -> bool:
    if _postgres_pid(stack) is None:
        return False
    _run_as_postgres([_pg_bin("pg_ctl"), "-D", str(stack.pg_data), "-m", "fast", "-w", "stop"], "stopping")
    return True


def write_private(path: Path, text: str) -> None:
    """``text`` as ``path``, readable by its owner only from its first byte, replacing the old file
    whole: a kill or a full disk while writing leaves the old file (the password in it), never half."""
    with atomic_path(path) as temporary, os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                                                   "w") as out:
        out.write(text)


def _pid_file(stack: Stack, name: str) -> Path:
    return stack.base / f"{name}.pid"


def running(stack: Stack, name: str) -> int | None:
    """The pid of service ``name`` (which is also its program's name) if that process runs it."""
    file = _pid_file(stack, name)
    if not file.is_file():
        return None
    try:
        pid = int(file.read_text())
    except ValueError:  # emptied by a kill while it was written: nothing known runs
        return None
    return pid if runs(pid, name) else None


def start_process(stack: Stack, name: str, command: list[str], env: dict[str, str]) -> int:
    """``command`` in a session of its own (stopping it stops what it started: the daemon's code
    server and run workers), logging to ``<name>.log``; its pid in ``<name>.pid``."""
    if (pid := running(stack, name)) is not None:
        return pid
    with (stack.base / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(command, cwd=REPOSITORY, env={**os.environ, **env}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=default_stop_signals)
    _pid_file(stack, name).write_text(str(process.pid))
    return process.pid


def stop_process(stack: Stack, name: str, grace_s: float = 30.0, crash: bool = False) -> bool:
    """Stop ``name`` and what it started; ``crash``: SIGKILL at once, as a host crash would. Its pid
    file goes, whether or not its pid still ran the service."""
    pid = running(stack, name)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):  # not a group leader (a pid reused): the others still stop
            os.killpg(pid, signal.SIGKILL if crash else signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            os.killpg(pid, signal.SIGKILL)  # what the leader started and left behind, too
    _pid_file(stack, name).unlink(missing_ok=True)
    return pid is not None


def wait_http(url: str, what: str, log: Path, seconds: float = 180.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not answer {url} within {seconds:.0f} s; {log}:\n"
                       + log.read_text(errors="replace")[-2000:])


def write_instance(stack: Stack) -> None:
    """The local instance file (orchestration/dagster.yaml) with PostgreSQL storage added."""
    config = yaml.safe_load((REPOSITORY / "orchestration" / "dagster.yaml").read_text())
    if stack.monitoring_poll_s is not None:
        config["run_monitoring"].update(poll_interval_seconds=stack.monitoring_poll_s,
                                        free_slots_after_run_end_seconds=stack.monitoring_poll_s)
    config["storage"] = {"postgres": {"postgres_db": {
        "username": "fresh", "password": {"env": "DAGSTER_PG_PASSWORD"}, "hostname": HOST,
        "port": stack.ports.postgres, "db_name": "dagster",
        "scheme": "postgresql+psycopg2"}}}  # SQLAlchemy 2 maps postgresql:// to psycopg 3, which dagster-postgres fails on
    stack.dagster_home.mkdir(parents=True, exist_ok=True)
    (stack.dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def _one_at_a_time(stack: Stack, action: str) -> contextlib.AbstractContextManager[None]:
    """The stack's lock, held through an ``up`` or a ``down``: two ``up`` at once would each find a
    service stopped and start it (one server left running without a pid file), and a ``down``
    during an ``up`` could remove the pid file of a server just started."""
    return exclusive_lock(stack.base / "up-down.lock",
                          waiting=f"{action}: another up or down of the stack in {stack.base} runs; waiting for it")


def up(stack: Stack) -> dict[str, str]:
    """Start every service (those running already are left alone); the environment to use it."""
    with _one_at_a_time(stack, "up"):
        up_stores(stack)
        return up_dagster(stack)


def up_stores(stack: Stack) -> None:
    """PostgreSQL, the MLflow server and the Milvus Lite server: what a workspace registers into."""
    stack.base.mkdir(parents=True, exist_ok=True)
    start_postgres(stack)
    start_mlflow(stack)
    milvus_lite.up(stack.base / "milvus", stack.ports.milvus)
    wait_http(f"{stack.tracking_uri}/health", "the MLflow server", stack.base / "mlflow.log")


def start_mlflow(stack: Stack) -> None:
    artifacts = stack.base / "mlflow-artifacts"
    start_process(stack, "mlflow", [str(BIN / "mlflow"), "server", "--host", HOST, "--port", str(stack.ports.mlflow),
                                    "--artifacts-destination", str(artifacts), "--workers", "1"],
                  {"MLFLOW_BACKEND_STORE_URI": stack.database_uri("mlflow"), "PATH": f"{BIN}:{os.environ['PATH']}"})


def up_dagster(stack: Stack, webserver: bool = True) -> dict[str, str]:
    """The Dagster daemon (and webserver) on PostgreSQL storage; the environment to use the stack."""
    environment = stack.service_env()
    write_private(stack.env_file, "".join(f"export {k}={v}\n" for k, v in environment.items()))
    write_instance(stack)
    start_daemon(stack)
    if webserver:
        start_process(stack, "dagster-webserver", [str(BIN / "dagster-webserver"), "-h", HOST, "-p",
                                                   str(stack.ports.dagster), "-m", stack.definitions], environment)
        wait_http(f"http://{HOST}:{stack.ports.dagster}/server_info", "the Dagster webserver",
                  stack.base / "dagster-webserver.log")
    return environment


def start_daemon(stack: Stack) -> int:
    return start_process(stack, "dagster-daemon", [str(BIN / "dagster-daemon"), "run", "-m", stack.definitions],
                         stack.service_env())


def down(stack: Stack) -> list[str]:
    """Stop every service by its own pid; the names of those that ran."""
    if not stack.base.is_dir():  # never made: nothing runs, and no folder is made for the lock
        return []
    with _one_at_a_time(stack, "down"):
        stopped = [name for name in ("dagster-webserver", "dagster-daemon", "mlflow") if stop_process(stack, name)]
        if milvus_lite.down(stack.base / "milvus"):
            stopped.append("milvus")
        if stop_postgres(stack):
            stopped.append("postgres")
    return stopped


def status(stack: Stack) -> str:
    lines = []
    postgres = _postgres_pid(stack)
    lines.append(f"postgres           {'pid ' + str(postgres) if postgres else 'stopped'}  {HOST}:{stack.ports.postgres}")
    for name, where in (("mlflow", stack.tracking_uri), ("dagster-daemon", f"DAGSTER_HOME={stack.dagster_home}"),
                        ("dagster-webserver", f"http://{HOST}:{stack.ports.dagster}")):
        pid = running(stack, name)
        lines.append(f"{name:<18} {'pid ' + str(pid) if pid else 'stopped'}  {where}")
    lines.append(milvus_lite.status(stack.base / "milvus"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestration.stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=Path(".stack"), help="where the stack keeps its files")
    parser.add_argument("--workspace", type=Path, default=Path("."), help="the workspace the Dagster daemon runs on")
    args = parser.parse_args(argv)
    stack = Stack(args.dir.resolve(), args.workspace.resolve())
    if args.action == "up":
        started = time.monotonic()
        up(stack)
        print(status(stack))
        print(f"up in {time.monotonic() - started:.0f} s; to use it: source {stack.env_file}")
    elif args.action == "down":
        print("stopped: " + (", ".join(down(stack)) or "nothing was running"))
    else:
        print(status(stack))
    return 0


if __name__ == "__main__":
    sys.exit(main())
