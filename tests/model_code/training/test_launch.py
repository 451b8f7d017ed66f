"""``fresh-retriever train-distributed`` (``model_code/training/launch.py``): two torchrun agents,
started as two nodes from the same params (c10d rendezvous on loopback), train the tiny model
together: both exit cleanly, the training ran with world size 2, and rank 0 wrote the encoder."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

from model_code.config import load_params
from model_code.training.launch import torchrun_command
from orchestration.milvus_lite import free_port
from tests.conftest import REPOSITORY, run_stages, tiny_params


def test_the_torchrun_command_comes_from_the_params(tmp_path, beir_dir, tiny_model_dir):
    root = tmp_path / "ws"
    root.mkdir()
    settings = {"nodes": 4, "processes_per_node": 8, "rendezvous_endpoint": "trainer-0.train:29400",
                "rendezvous_id": "run-7", "rendezvous_timeout_s": 60}
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir, train={"distributed": settings})))
    command = torchrun_command(load_params(root / "params.yaml"), root / "params.yaml", root)
    assert command[1:] == ["--nnodes", "4", "--nproc-per-node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                           "trainer-0.train:29400", "--rdzv-id", "run-7", "--rdzv-conf", "join_timeout=60", "-m",
                           "model_code.cli", "train", "--params", str(root / "params.yaml"), "--root", str(root)]


def test_two_nodes_train_together(tmp_path, beir_dir, tiny_model_dir):
    port = free_port()
    distributed = {"nodes": 2, "processes_per_node": 1, "rendezvous_endpoint": f"127.0.0.1:{port}",
                   "rendezvous_id": "test-two-nodes", "rendezvous_timeout_s": 120}
    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir, train={"distributed": distributed}),
                        "ingest", "querygen", "mine-negatives", "cluster")
    command = [str(Path(sys.executable).with_name("fresh-retriever")), "train-distributed",
               "--params", str(layout.root / "params.yaml"), "--root", str(layout.root)]
    nodes = [subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    report = json.loads((layout.train_report / "metrics.json").read_text())
    assert report["world_size"] == 2 and report["steps"] == 3
    assert (layout.encoder / "config.json").is_file()
