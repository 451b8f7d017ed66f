"""Run the sweeps waiting for a GPU (``queue.yaml``, most wanted first), one after another.

    python3 benchmarks/gpu/queue.py [--data DIR] [--out DIR]

What ``bash benchmarks/gpu/run.sh`` runs when it is given no command, in the kit's clean clone with
``$DATA`` (the kit's datasets) and ``$RESULTS`` (what comes back) set. The queue is data, so adding
or dropping a measurement is an edit to ``queue.yaml``, not to a script. A sweep keeps every
finished run under ``--out``: when ``BUDGET`` stops the queue, the same call on the same warm machine
resumes where it stopped (a fresh machine starts over, its ``$RESULTS`` empty). The first sweep that
fails stops the queue, with its exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

QUEUE = Path(__file__).with_name("queue.yaml")
PROJECT = Path(__file__).resolve().parents[2]


def sweep_arguments(queue: dict, data: Path, out: Path) -> list[list[str]]:
    """Each queued sweep as ``benchmarks.sweep``'s arguments: ``data`` holds the queue's dataset, an
    entry's ``seeds`` overrides the queue's and its ``set`` gives ``--set`` overrides."""
    def assignments(flag: str, settings: dict) -> list[str]:  # KEY=VALUE, the value in JSON (which is YAML)
        return [arg for key, value in settings.items() for arg in (flag, f"{key}={json.dumps(value)}")]

    return [["--data", str(data / queue["dataset"]), "--out", str(out), "--name", sweep["name"],
             "--base", sweep["base"], "--baseline", sweep["baseline"],
             "--seeds", str(sweep.get("seeds", queue["seeds"])),
             *assignments("--grid", sweep["grid"]), *assignments("--set", sweep.get("set", {}))]
            for sweep in queue["sweeps"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="queue.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=os.environ.get("DATA"), help="folder of datasets ($DATA)")
    parser.add_argument("--out", type=Path, default=os.environ.get("RESULTS"), help="results folder ($RESULTS)")
    args = parser.parse_args(argv)
    if args.data is None or args.out is None:
        parser.error("--data and --out (or $DATA and $RESULTS, as run.sh sets them) are required")
    for arguments in sweep_arguments(yaml.safe_load(QUEUE.read_text()), args.data, args.out):
        print("queue: python3 -m benchmarks.sweep " + shlex.join(arguments), flush=True)
        status = subprocess.run([sys.executable, "-m", "benchmarks.sweep", *arguments], cwd=PROJECT, check=False)
        if status.returncode:
            return status.returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
