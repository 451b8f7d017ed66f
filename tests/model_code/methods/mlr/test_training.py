"""MLR training (paper §3; reference code in ../shared/design/seed-reference.md §2.2) against
computations written from the paper, not from the code: each pooling's loss on a tiny batch with a
hard negative, the scalar mix's gradients and its uniform start, and the train and index stages
for scalar_mix (weights trained, saved, used by the index) and self_contrastive (one row per
document, the last layer's)."""

import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml

from model_code.cli import main
from model_code.data.ingested import load_ingested, passage_texts
from model_code.layout import Layout
from model_code.methods.mlr.layer_mix import ScalarMix
from model_code.methods.mlr.loss import mlr_infonce
from model_code.methods.mlr.objective import MLRObjective
from model_code.models.encoder import Encoder
from model_code.retrievers import load_retriever
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import Stream
from tests.conftest import run_stages, tiny_params
from tests.helpers.losses import TAU, mlr_by_hand

LAMBDA = 0.7


class LayerTable:
    """Texts -> fixed (m, dim) unit layer vectors (last layer first), standing in for the encoder:
    a query is its last layer's vector, a document all of them."""

    def __init__(self, table: dict[str, torch.Tensor], layers: list[int]):
        self.table, self.layers = table, layers

    def tokenize(self, texts, length):
        return texts

    def __call__(self, texts):
        return torch.stack([self.table[t][0] for t in texts])

    def layer_vectors(self, texts, layers):
        assert layers == self.layers
        return torch.stack([self.table[t] for t in texts])


@pytest.fixture
def tiny():
    """Three (query, positive) rows with two-layer documents and one mined negative for qa and qb."""
    g = torch.Generator().manual_seed(11)
    texts = ["qa", "qb", "qc"] + [f"text d{i}" for i in range(5)]
    table = {t: F.normalize(torch.randn(2, 4, generator=g, dtype=torch.float64), dim=-1) for t in texts}
    batch = pd.DataFrame({"query": ["qa", "qb", "qc"], "doc_id": ["d0", "d1", "d2"]})
    batch["positives"] = [frozenset({d}) for d in batch["doc_id"]]
    mined = pd.DataFrame({"query": ["qa", "qb"], "doc_id": ["d3", "d4"]})
    q = [table[t][0].numpy() for t in ("qa", "qb", "qc")]
    d = [table[f"text d{i}"].numpy() for i in range(3)]
    h = [table[f"text d{i}"].numpy() for i in (3, 4)]
    # the example tells the rules apart: a positive whose lower layer scores higher than its last,
    # and a hard negative whose lower layer scores higher too
    assert any(np.dot(q[i], d[i][1]) > np.dot(q[i], d[i][0]) for i in range(3))
    assert any(np.dot(qi, n[1]) > np.dot(qi, n[0]) for qi in q for n in h)
    return table, batch, mined, (q, d, h)


@pytest.mark.parametrize("pooling", ["multi", "mean", "scalar_mix", "self_contrastive"])
def test_each_poolings_loss_equals_a_hand_computation(tiny, pooling):
    table, batch, mined, (q, d, h) = tiny
    mix = ScalarMix([2, 1]).double()
    with torch.no_grad():
        mix.logits.copy_(torch.tensor([0.3, -0.4], dtype=torch.float64))
    objective = MLRObjective(LayerTable(table, [2, 1]), [Stream("s", itertools.repeat(batch), 1.0)],
                             lambda doc: f"text {doc}", TAU, 8, 8, [2, 1], pooling, LAMBDA,
                             mix if pooling == "scalar_mix" else None, HardNegatives(mined, 1, seed=0))
    loss, parts = objective()
    loss = loss.detach()
    weights = np.exp([0.3, -0.4]) / np.exp([0.3, -0.4]).sum()
    assert float(loss) == pytest.approx(mlr_by_hand(q, d, h, pooling, weights, LAMBDA), rel=1e-12)
    if pooling == "self_contrastive":
        regulariser = (float(loss) - mlr_by_hand(q, d, h, pooling)) / LAMBDA
        assert parts["s.regulariser"] == pytest.approx(regulariser, rel=1e-9)


def test_scalar_mix_weights_get_gradients_and_start_as_mean_pooling(tiny):
    _, _, _, (q, d, h) = tiny
    q, d, h = (torch.tensor(np.stack(x)) for x in (q, d, h))
    mix = ScalarMix([2, 1]).double()
    assert torch.equal(mix.weights(), torch.tensor([0.5, 0.5], dtype=torch.float64))
    excluded = torch.zeros(3, 2, dtype=torch.bool)
    mixed, _ = mlr_infonce(q, d, TAU, "scalar_mix", hard_negatives=h, hard_excluded=excluded, mix=mix)
    mean, _ = mlr_infonce(q, d, TAU, "mean", hard_negatives=h, hard_excluded=excluded)
    assert float(mixed.detach()) == pytest.approx(float(mean), rel=1e-12)
    mixed.backward()
    assert mix.logits.grad is not None and mix.logits.grad.abs().sum() > 0
    assert torch.allclose(mix.logits.grad.sum(), torch.zeros((), dtype=torch.float64))  # softmax: shifts cancel


def mlr_train_and_index(tmp_path, beir_dir, tiny_model_dir, pooling: str, **mlr) -> Layout:
    params = tiny_params(beir_dir, tiny_model_dir, train={"data": "supervised", "hard_negatives": 1},
                         retriever={"kind": "mlr", "mlr": {"layers": [2, 1], "pooling": pooling, **mlr}})
    return run_stages(tmp_path / pooling, params, "ingest", "mine-negatives", "train", "index")


def assert_brute_force(layout: Layout, document_vectors: np.ndarray, query: str, k: int = 5) -> None:
    """The retriever's top k for ``query`` are the documents whose ``document_vectors`` score best
    against the query's last-layer vector, with those scores."""
    vector = Encoder(str(layout.encoder)).encode([query], 16)[0]
    scores = document_vectors @ vector
    top = np.argsort(-scores, kind="stable")[:k]
    hit = load_retriever(layout.retriever, layout.encoder).search([query], k)[0]
    assert hit.doc_ids == load_ingested(layout.ingested).corpus["doc_id"].to_numpy()[top].tolist()
    assert hit.scores == pytest.approx(scores[top].tolist(), rel=1e-5)


def test_scalar_mix_weights_are_trained_saved_and_indexed(tmp_path, beir_dir, tiny_model_dir):
    layout = mlr_train_and_index(tmp_path, beir_dir, tiny_model_dir, "scalar_mix", mix_learning_rate=0.5)
    saved = json.loads((layout.encoder / "scalar_mix.json").read_text())
    weights = np.array(saved["weights"])
    assert saved["layers"] == [2, 1] and weights.sum() == pytest.approx(1.0) and abs(weights[0] - 0.5) > 0.01
    train = json.loads((layout.train_report / "metrics.json").read_text())
    assert train["scalar_mix_weights"] == pytest.approx(weights.tolist())
    manifest = json.loads((layout.retriever / "manifest.json").read_text())
    assert manifest["mlr_weights"] == pytest.approx(weights.tolist()) and manifest["rows"] == 48
    corpus = load_ingested(layout.ingested).corpus
    layers = Encoder(str(layout.encoder)).encode(passage_texts(corpus), 32, layers=[2, 1])
    mixed = np.einsum("nmd,m->nd", layers, weights)
    assert_brute_force(layout, mixed, "astronomy comet")


def test_self_contrastive_indexes_the_last_layer_alone(tmp_path, beir_dir, tiny_model_dir):
    layout = mlr_train_and_index(tmp_path, beir_dir, tiny_model_dir, "self_contrastive", reg_weight=0.1)
    steps = pd.read_csv(layout.train_report / "steps.csv")
    assert len(steps) == 3 and steps["supervised.regulariser"].gt(0).all()
    assert json.loads((layout.retriever / "manifest.json").read_text())["rows"] == 48
    corpus = load_ingested(layout.ingested).corpus
    last = Encoder(str(layout.encoder)).encode(passage_texts(corpus), 32)
    assert_brute_force(layout, last, "cooking flour")


def test_the_train_stage_weighs_the_regulariser_by_the_reg_weight_params_name(tmp_path, beir_dir, tiny_model_dir):
    """Same seed, same first batch, same model at λ 0 and λ 0.5: the first step's losses differ
    by exactly 0.5 times its regulariser (logged unweighted), so a stage that passed another λ
    (the objective's default 0) fails."""
    first = {}
    for reg_weight in (0.0, 0.5):
        layout = mlr_train_and_index(tmp_path / str(reg_weight), beir_dir, tiny_model_dir, "self_contrastive",
                                     reg_weight=reg_weight)
        first[reg_weight] = pd.read_csv(layout.train_report / "steps.csv").iloc[0]
    assert first[0.5]["supervised.regulariser"] == pytest.approx(first[0.0]["supervised.regulariser"], rel=1e-6)
    assert first[0.5]["supervised.regulariser"] > 0.01
    assert first[0.5]["loss"] - first[0.0]["loss"] == pytest.approx(0.5 * first[0.5]["supervised.regulariser"],
                                                                    rel=1e-4)


def test_the_index_stage_needs_the_trained_mix(tmp_path, beir_dir, tiny_model_dir):
    layout = mlr_train_and_index(tmp_path, beir_dir, tiny_model_dir, "mean")
    params = yaml.safe_load((layout.root / "params.yaml").read_text())
    params["retriever"]["mlr"]["pooling"] = "scalar_mix"
    (layout.root / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["index", "--params", str(layout.root / "params.yaml"), "--root", str(layout.root)]) == 2
