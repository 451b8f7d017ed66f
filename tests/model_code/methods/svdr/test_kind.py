"""Kind ``svdr`` through the pipeline: the train stage trains the sparse encoder that the index
stage then uses, the optimised loss and top-k are the ones params name, the index stage writes the
binary index of the corpus (against token sets taken from the tokenizer per document), and the kind
is registered, served, updated and run by the Dagster asset graph. (Its units against independent
computations: ``test_model.py``, ``test_token_bags.py``, ``test_retriever.py``, ``test_loss.py``,
``test_training.py`` here and ``tests/model_code/stores/test_csr_store.py``.)"""

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from transformers import AutoTokenizer

from model_code.cli import main
from model_code.config import load_params
from model_code.data.ingested import load_ingested, passage_texts
from model_code.layout import Layout
from model_code.methods.svdr.model import SparseEncoder
from model_code.retrievers import load_retriever
from model_code.versions.chain import RetrieverVersions
from tests.conftest import run_stages, tiny_params
from tests.helpers.batches import write_batch
from tests.helpers.svdr import binary
from tracking.registry import register


@pytest.fixture(scope="module")
def svdr_workspace(tmp_path_factory, tiny_model_dir):
    from tests.conftest import write_beir

    tmp = tmp_path_factory.mktemp("svdr")
    root = tmp / "workspace"
    params = tiny_params(write_beir(tmp / "beir"), tiny_model_dir, train={"enabled": False},
                         retriever={"kind": "svdr", "svdr": {"search": "beta_rerank", "rerank_depth": 5}})
    run_stages(root, params, "ingest", "querygen", "cluster", "train", "index", "evaluate")
    return root


def test_the_train_stage_trains_the_sparse_encoder_and_the_index_stage_uses_it(tmp_path, beir_dir, tiny_model_dir):
    params = tiny_params(beir_dir, tiny_model_dir, retriever={"kind": "svdr", "svdr": {"shared_encoder": False,
                                                                                        "search": "full", "topk": 100}})
    layout = run_stages(tmp_path / "ws", params, "ingest", "querygen", "cluster", "train", "index", "evaluate")
    steps = pd.read_csv(layout.train_report / "steps.csv")
    assert len(steps) == 3 and {"joint.q_k.p", "joint.q.p_k", "joint.bin_q.p", "joint.q.bin_p"} <= set(steps.columns)
    trained = SparseEncoder(str(layout.encoder), shared=False)
    assert not torch.equal(trained.query.norm.weight, torch.ones(32))  # the LayerNorm trained and was saved
    assert (layout.encoder / "passage" / "config.json").is_file()
    retriever = load_retriever(layout.retriever, layout.encoder)
    texts = passage_texts(load_ingested(layout.ingested).corpus)
    expected = trained.encode(texts, "passage", 32, 100, lexical=False).toarray()
    np.testing.assert_allclose(retriever.index.matrix.toarray(), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="train.method contrastive"):
        from model_code.stages import train

        train.run(load_params(layout.root / "params.yaml", {"train": {"method": "hce"}}), layout)


def first_step(tmp_path, beir_dir, tiny_model_dir, name: str, **svdr) -> pd.Series:
    """The train stage's first logged step (before any update) for these ``retriever.svdr`` settings."""
    params = tiny_params(beir_dir, tiny_model_dir, train={"data": "supervised", "max_steps": 1},
                         retriever={"kind": "svdr", "svdr": {"search": "beta", **svdr}})
    return pd.read_csv(run_stages(tmp_path / name, params, "ingest", "train").train_report / "steps.csv").iloc[0]


def test_the_train_stage_optimises_the_loss_and_top_k_that_params_name(tmp_path, beir_dir, tiny_model_dir):
    """Same seed, same first batch, same model: ``loss: vdr`` logs exactly its two terms, with the
    loss their mean, equal to svdr's same two terms; ``topk`` moves only the terms that sparsify
    the encoder's vectors. A stage that passed the default loss or top-k fails one of these."""
    svdr = first_step(tmp_path, beir_dir, tiny_model_dir, "svdr", loss="svdr", topk=3000)
    vdr = first_step(tmp_path, beir_dir, tiny_model_dir, "vdr", loss="vdr", topk=3000)
    lexical_only = first_step(tmp_path, beir_dir, tiny_model_dir, "lexical", loss="svdr", topk=0)
    every, shared = ["q_k.p", "q.p_k", "bin_q.p", "q.bin_p"], ["q_k.p", "bin_q.p"]
    column = lambda names: [f"supervised.{name}" for name in names]
    assert sorted(c for c in vdr.index if c.startswith("supervised.")) == sorted(column(shared))
    assert vdr["loss"] == pytest.approx(vdr[column(shared)].mean(), rel=1e-5)
    assert svdr["loss"] == pytest.approx(svdr[column(every)].mean(), rel=1e-5)
    assert vdr[column(shared)].tolist() == pytest.approx(svdr[column(shared)].tolist(), rel=1e-5)
    moved = {name for name in every
             if lexical_only[f"supervised.{name}"] != pytest.approx(svdr[f"supervised.{name}"], rel=1e-5)}
    assert moved == {"q_k.p", "q.p_k"}


def test_the_index_stage_writes_the_binary_index_of_the_corpus(svdr_workspace):
    layout = Layout(svdr_workspace)
    manifest = json.loads((layout.retriever / "manifest.json").read_text())
    assert manifest["kind"] == "svdr" and manifest["svdr"]["search"] == "beta_rerank" and manifest["documents"] == 48
    retriever = load_retriever(layout.retriever, layout.encoder)
    corpus = load_ingested(layout.ingested).corpus
    tokenizer = AutoTokenizer.from_pretrained(layout.encoder)
    np.testing.assert_array_equal(retriever.index.matrix.toarray(), binary(tokenizer, passage_texts(corpus), 32))
    assert json.loads((layout.eval_report / "metrics.json").read_text())["retriever"] == "svdr"


def test_an_svdr_retriever_is_registered_served_and_updated(svdr_workspace, tmp_path, mlflow_uri):
    root, layout = svdr_workspace, Layout(svdr_workspace)
    uri = mlflow_uri
    result = register(load_params(root / "params.yaml"), layout, tracking_uri=uri)
    assert result["retriever"] == "svdr"
    mlflow.set_tracking_uri(uri)
    answer = mlflow.pyfunc.load_model(result["model_uri"]).predict(["recipe oven flour butter"], params={"k": 3})
    direct = load_retriever(layout.retriever, layout.encoder).search(["recipe oven flour butter"], 3)[0]
    assert answer["doc_ids"][0] == direct.doc_ids

    batch = write_batch(tmp_path / "new.jsonl", [{"_id": "volcano", "title": "volcano", "text": "lava magma crater"}])
    args = ["--params", str(root / "params.yaml"), "--root", str(root)]
    assert main(["add-documents", str(batch), *args]) == 0
    assert main(["remove-documents", "astronomy-0", *args]) == 0
    current = RetrieverVersions(layout).load()
    assert "volcano" in current.live_ids() and "astronomy-0" not in current.live_ids()
    assert current.search(["volcano. lava magma crater"], 1)[0].doc_ids == ["volcano"]


def test_the_dagster_asset_graph_runs_the_svdr_kind(tmp_path, beir_dir, tiny_model_dir):
    """The pipeline's assets up to evaluation with retriever.kind svdr (registration is the CLI's
    and dvc repro's test): corpus_tree is a not_used stand-in, the sparse encoder trains, the
    binary index is built and evaluated."""
    import dagster as dg

    from orchestration.jobs import PIPELINE_ASSETS
    from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource

    root = tmp_path / "svdr-workspace"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir, retriever={"kind": "svdr"})))
    selected = [asset for asset in PIPELINE_ASSETS if asset.key.to_user_string() != "registered_model"]
    result = dg.materialize(selected, resources={
        "params": ParamsResource(path=str(root / "params.yaml")), "workspace": WorkspaceResource(root=str(root)),
        "mlflow_store": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")})
    assert result.success
    metadata = {node: result.asset_materializations_for_node(node)[0].metadata
                for node in ("corpus_tree", "encoder", "retriever_index", "evaluation")}
    assert metadata["corpus_tree"]["used"].value is False
    assert metadata["corpus_tree"]["reason"].value == "retriever.kind svdr uses no corpus tree"
    assert metadata["encoder"]["steps"].value == 3
    assert metadata["retriever_index"]["kind"].value == "svdr"
    assert metadata["evaluation"]["queries"].value == 12
    layout = Layout(root)
    assert json.loads((layout.final_tree / "not_used.json").read_text())["used"] is False
    retriever = load_retriever(layout.retriever, layout.encoder)
    corpus = load_ingested(layout.ingested).corpus
    tokenizer = AutoTokenizer.from_pretrained(layout.encoder)
    np.testing.assert_array_equal(retriever.index.matrix.toarray(), binary(tokenizer, passage_texts(corpus), 32))
