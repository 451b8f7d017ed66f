"""The untied query encoder (``encoder.shared_encoder: false``, the MLR paper's setting) against
computations made here with transformers and torch alone: each side's gradient from a hand-run
forward/backward through two separate copies of the tiny BERT, query and document vectors from
the saved ``query/`` and passage weights, the index stage's vectors and an addition's, a search
by brute force, the same answers through the MLflow pyfunc, and the tied default left as it was."""

import functools
import itertools

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import AutoModel, AutoTokenizer

from model_code.cli import main
from model_code.config import TrainParams, load_params
from model_code.data.ingested import load_ingested, passage_texts
from model_code.layout import Layout
from model_code.models.encoder import Encoder
from model_code.retrievers import load_retriever
from model_code.retrievers.base import UpdateContext
from model_code.training.loop import Trainer
from model_code.training.objectives import ContrastiveObjective, Stream
from model_code.training.pairs import with_positives
from tests.conftest import run_stages, tiny_params, write_beir
from tracking.pyfunc import log_retriever
from tracking.store import configure

TAU = 0.1
QUERIES = ["stars and planets", "flour butter oven", "stocks and bonds", "guitar chord melody"]
PASSAGES = {"d0": "a comet orbits the star", "d1": "knead the dough and simmer", "d2": "inflation raises interest",
            "d3": "the orchestra keeps tempo"}


def pooled(model_dir, texts: list[str], max_length: int, layers: list[int] | None = None, grad: bool = False,
           model: torch.nn.Module | None = None) -> torch.Tensor:
    """Masked mean of a layer's token states, L2-normalised: the last layer, or each of ``layers``."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = model or AutoModel.from_pretrained(model_dir).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.set_grad_enabled(grad):
        states = model(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"].unsqueeze(-1).float()
    vectors = [F.normalize((states[layer] * mask).sum(1) / mask.sum(1), dim=-1) for layer in (layers or [-1])]
    return torch.stack(vectors, dim=1) if layers else vectors[0]


def trained_workspace(root, tiny_model_dir, kind: str = "dense", shared: bool = False, **sections) -> Layout:
    """The ingest, train (3 steps) and index stages run on the tiny corpus with ``encoder.shared_encoder``."""
    root.mkdir()
    params = tiny_params(write_beir(root / "beir"), tiny_model_dir, encoder={"shared_encoder": shared},
                         train={"data": "supervised", "max_passage_length": 32}, **sections)
    params["retriever"]["kind"] = kind
    return run_stages(root, params, "ingest", "train", "index")


@pytest.fixture(scope="module")
def untied(tmp_path_factory, tiny_model_dir) -> Layout:
    return trained_workspace(tmp_path_factory.mktemp("untied") / "root", tiny_model_dir)


@pytest.fixture(scope="module")
def tied(tmp_path_factory, tiny_model_dir) -> Layout:
    return trained_workspace(tmp_path_factory.mktemp("tied") / "root", tiny_model_dir, shared=True)


def weights(directory) -> dict[str, torch.Tensor]:
    return AutoModel.from_pretrained(directory).state_dict()


def test_each_side_gets_the_gradient_of_its_own_texts_only(tiny_model_dir):
    """The objective's loss and gradients equal a hand-run bidirectional InfoNCE whose queries go
    through one BERT copy and whose passages through another: the query side's gradient comes
    from the queries alone, the passage side's from the passages alone. A few trainer steps then
    move both sides, apart."""
    encoder = Encoder(str(tiny_model_dir), untie=True).eval()  # eval: no dropout, as the hand-run
    batch = with_positives(pd.DataFrame({"query": QUERIES, "doc_id": list(PASSAGES)}))
    objective = ContrastiveObjective(encoder, [Stream("s", itertools.repeat(batch), 1.0)], PASSAGES.__getitem__,
                                     TAU, 16, 32, query_forward=functools.partial(encoder, side="query"))
    loss, _ = objective()
    loss.backward()

    query_model = AutoModel.from_pretrained(tiny_model_dir).eval()
    passage_model = AutoModel.from_pretrained(tiny_model_dir).eval()
    q = pooled(tiny_model_dir, QUERIES, 16, grad=True, model=query_model)
    p = pooled(tiny_model_dir, list(PASSAGES.values()), 32, grad=True, model=passage_model)
    scores = q @ p.T / TAU
    target = torch.arange(len(QUERIES))
    by_hand = F.cross_entropy(scores, target) + F.cross_entropy(scores.T, target)
    by_hand.backward()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
    for ours, theirs in ((encoder.query_model, query_model), (encoder.model, passage_model)):
        for (name, got), want in zip(ours.named_parameters(), theirs.parameters()):
            if want.grad is None:  # the pooler: unused by either side
                assert got.grad is None or not got.grad.any(), name
            else:
                assert torch.allclose(got.grad, want.grad, atol=1e-6, rtol=1e-4), name

    encoder.zero_grad()
    params = TrainParams(max_steps=3, batch_size=4, learning_rate=1e-3, warmup_ratio=0.0)
    Trainer(encoder, params, params.max_steps).train(objective, params.max_steps)
    start = dict(query_model.named_parameters())
    name = "encoder.layer.0.attention.self.query.weight"
    query_side = dict(encoder.query_model.named_parameters())[name].detach()
    passage_side = dict(encoder.model.named_parameters())[name].detach()
    assert not torch.equal(query_side, start[name]) and not torch.equal(passage_side, start[name])
    assert not torch.allclose(query_side, passage_side)


def test_an_untied_retriever_encodes_queries_and_documents_each_with_its_side(untied):
    """After the train and index stages: queries are the saved query/ model's vectors, the index
    and an added document hold the passage model's, and search ranks by their inner product."""
    layout = untied
    query_dir = layout.encoder / "query"
    assert query_dir.is_dir()
    trained_query, trained_passage = weights(query_dir), weights(layout.encoder)
    assert any(not torch.equal(trained_query[k], trained_passage[k]) for k in trained_passage)

    retriever = load_retriever(layout.retriever, layout.encoder)
    assert retriever.encoder.manifest()["encoder"]["shared_encoder"] is False
    texts = ["astronomy comet", "cooking flour oven"]
    by_query_side = pooled(query_dir, texts, 16).numpy()
    assert np.allclose(retriever.encoder.embed_queries(texts), by_query_side, atol=1e-5)
    assert not np.allclose(pooled(layout.encoder, texts, 16).numpy(), by_query_side, atol=1e-3)

    corpus = load_ingested(layout.ingested).corpus
    documents = pooled(layout.encoder, passage_texts(corpus), 32).numpy()
    ids = corpus["doc_id"].tolist()
    assert np.allclose(retriever.index.vectors(ids), documents, atol=1e-5)
    scores = documents @ by_query_side[0]
    top = np.argsort(-scores, kind="stable")[:5]
    hit = retriever.search(texts[:1], 5)[0]
    assert hit.doc_ids == [ids[i] for i in top] and hit.scores == pytest.approx(scores[top].tolist(), rel=1e-4)

    new = pd.DataFrame({"doc_id": ["new-1"], "title": ["Comets"], "text": ["a comet passes the sun every year"]})
    retriever.add(new, UpdateContext(load_params(layout.root / "params.yaml"), layout))
    assert np.allclose(retriever.index.vectors(["new-1"]), pooled(layout.encoder, passage_texts(new), 32).numpy(),
                       atol=1e-5)


def test_untied_mlr_scores_query_side_vectors_against_passage_side_layers(tmp_path, tiny_model_dir):
    """Multi-vector MLR: a document scores its best layer of the passage model against the query
    model's last layer."""
    layout = trained_workspace(tmp_path / "mlr", tiny_model_dir, "mlr",
                               retriever={"mlr": {"layers": [2, 1], "pooling": "multi"}})
    corpus = load_ingested(layout.ingested).corpus
    layers = pooled(layout.encoder, passage_texts(corpus), 32, layers=[2, 1]).numpy()
    query = pooled(layout.encoder / "query", ["finance stocks"], 16).numpy()[0]
    scores = (layers @ query).max(axis=1)
    top = np.argsort(-scores, kind="stable")[:5]
    hit = load_retriever(layout.retriever, layout.encoder).search(["finance stocks"], 5)[0]
    ids = corpus["doc_id"].to_numpy()
    assert hit.doc_ids == ids[top].tolist() and hit.scores == pytest.approx(scores[top].tolist(), rel=1e-4)


def test_untied_hce_training_saves_and_trains_both_sides(tmp_path, beir_dir, tiny_model_dir):
    """HCE training with EM rounds (dev scoring, re-clustering) trains and saves the two sides,
    which then differ from each other and from the base model."""
    params = tiny_params(beir_dir, tiny_model_dir, encoder={"shared_encoder": False},
                         train={"method": "hce", "max_passage_length": 32,
                                "hce": {"mode": "S", "rounds": 2, "dev_max_queries": 8}})
    layout = run_stages(tmp_path / "hce", params, "ingest", "cluster", "train")
    base, query, passage = weights(tiny_model_dir), weights(layout.encoder / "query"), weights(layout.encoder)
    key = "encoder.layer.1.output.dense.weight"
    assert not torch.equal(query[key], passage[key])
    assert not torch.equal(query[key], base[key]) and not torch.equal(passage[key], base[key])


def test_the_pyfunc_serves_an_untied_model_with_its_query_encoder(untied, tmp_path, mlflow_uri):
    """Logged to MLflow and loaded back, the model answers as the retriever it was logged from
    (whose queries are the query side's, above), its encoder artifact carrying query/."""
    layout = untied
    configure(tmp_path, "untied", mlflow_uri)
    with mlflow.start_run():
        info = log_retriever(layout.encoder, layout.retriever, load_params(layout.root / "params.yaml").serve)
    served = mlflow.pyfunc.load_model(info.model_uri)
    assert served.unwrap_python_model().retriever.encoder.model.query_model is not None
    queries = ["music chord", "sports referee"]
    answer = served.predict(queries, params={"k": 4})
    for row, hit in zip(answer.itertuples(), load_retriever(layout.retriever, layout.encoder).search(queries, 4)):
        assert list(row.doc_ids) == hit.doc_ids and list(row.scores) == pytest.approx(hit.scores, rel=1e-5)


def test_the_tied_default_saves_and_encodes_as_before(tied):
    """No query/ directory, no query-side modules, queries through the one transformer."""
    layout = tied
    assert not (layout.encoder / "query").exists()
    encoder = Encoder(str(layout.encoder))
    assert encoder.shared and not any(k.startswith("query_model") for k in encoder.state_dict())
    retriever = load_retriever(layout.retriever, layout.encoder)
    assert retriever.encoder.manifest()["encoder"]["shared_encoder"] is True
    texts = ["astronomy comet", "cooking flour oven"]
    assert np.allclose(retriever.encoder.embed_queries(texts), pooled(layout.encoder, texts, 16).numpy(), atol=1e-5)


def test_a_mismatched_tying_is_a_clear_error(tied, tmp_path, tiny_model_dir, capsys):
    """An index built untied over a tied encoder directory, tied training from an untied model,
    and svdr with the dense kinds' setting are refused, each naming the setting."""
    retriever = load_retriever(tied.retriever, tied.encoder)
    retriever.encoder.settings["shared_encoder"] = False
    with pytest.raises(ValueError, match="encoder.shared_encoder False"):
        retriever.encoder.embed_queries(["a query"])

    Encoder(str(tiny_model_dir), untie=True).save(tmp_path / "untied-model", 32)
    params = yaml.safe_load((tied.root / "params.yaml").read_text())
    params["encoder"]["model"] = str(tmp_path / "untied-model")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    args = ["train", "--params", str(path), "--root", str(tied.root)]
    assert main(args) == 2
    assert "holds a separate query encoder (query/): set encoder.shared_encoder to false" in capsys.readouterr().err
    params["encoder"] |= {"model": str(tiny_model_dir), "shared_encoder": False}
    params["retriever"]["kind"] = "svdr"
    path.write_text(yaml.safe_dump(params))
    assert main(args) == 2
    assert "retriever.svdr.shared_encoder" in capsys.readouterr().err


@pytest.mark.parametrize("objective_kind", ["hce", "mlr"])
def test_hce_and_mlr_objectives_encode_queries_with_the_query_side(tiny_model_dir, objective_kind):
    """HCE's and MLR's objectives pass their query encoder on: the batch's queries, and only they,
    go through ``query_forward``, so an untied encoder's query side gets the queries' gradient."""
    from model_code.hierarchy.tree import build_tree
    from model_code.methods.hce.loss import HCELoss
    from model_code.methods.hce.objective import HCEObjective
    from model_code.methods.mlr.objective import MLRObjective

    encoder = Encoder(str(tiny_model_dir), untie=True).eval()
    batch = with_positives(pd.DataFrame({"query": QUERIES, "doc_id": list(PASSAGES)}))
    stream = Stream("s", itertools.repeat(batch), 1.0)
    seen = []

    def query_forward(tokens):
        seen.append(tokens["input_ids"].shape[0])
        return encoder(tokens, side="query")

    if objective_kind == "hce":
        vectors = encoder.encode(list(PASSAGES.values()), 32)
        tree = build_tree(list(PASSAGES), vectors, branching=2, niter=5, seed=0)
        objective = HCEObjective(encoder, HCELoss(tree, levels_trained=1, temperature=TAU, n_negatives=1), [stream],
                                 list(PASSAGES), list(PASSAGES.values()), torch.as_tensor(vectors), False, 16, 32,
                                 torch.Generator().manual_seed(0), query_forward=query_forward)
    else:
        objective = MLRObjective(encoder, [stream], PASSAGES.__getitem__, TAU, 16, 32, [2, 1], "self_contrastive",
                                 reg_weight=0.5, query_forward=query_forward)
    loss, _ = objective()
    loss.backward()
    assert seen == [len(QUERIES)]
    assert encoder.query_model.embeddings.word_embeddings.weight.grad.any()
