"""``fresh-retriever train-distributed``: the train stage on several machines, from ``params.yaml``.

Every node runs the same command with the same params; it becomes ``torchrun`` with a c10d
rendezvous at ``train.distributed.rendezvous_endpoint`` (no node is special: torchrun elects the
store host), ``train.distributed.nodes`` nodes and ``processes_per_node`` processes each, running
``fresh-retriever train``. The trainer already works under torchrun: every rank draws the same
global batch and encodes its slice (``training/distributed.py``), and rank 0 writes the outputs, so
the workspace must be one filesystem every node mounts (a shared volume on Kubernetes).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from model_code.config import Params


def torchrun_command(params: Params, params_file: str | Path, root: str | Path) -> list[str]:
    """The ``torchrun`` command line a node runs (the same on every node)."""
    settings = params.train.distributed
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    return [torchrun, "--nnodes", str(settings.nodes), "--nproc-per-node", str(settings.processes_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", settings.rendezvous_endpoint,
            "--rdzv-id", settings.rendezvous_id, "--rdzv-conf", f"join_timeout={settings.rendezvous_timeout_s}",
            "-m", "model_code.cli", "train", "--params", str(Path(params_file).resolve()),
            "--root", str(Path(root).resolve())]
