"""HCE training: every mode end to end on tiny data, EM rounds, and 2-rank DDP == 1 process."""

import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from model_code.cli import main
from model_code.config import TrainParams
from model_code.hierarchy.tree import build_tree
from model_code.layout import Layout
from model_code.methods.hce.loss import HCELoss
from model_code.methods.hce.objective import HCEObjective
from model_code.models.encoder import Encoder, best_device
from model_code.training.distributed import average_gradients
from model_code.training.loop import Trainer
from model_code.training.objectives import ContrastiveObjective, Stream
from model_code.training.pairs import with_positives
from tests.conftest import run_stages


def run_with_train(workspace, *stages, **train):
    """``stages`` with these ``train`` settings over the workspace's params; the train report when trained."""
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["train"].update(train)
    run_stages(workspace, params, *stages)
    if "train" in stages:
        report = Layout(workspace).train_report
        summary = json.loads((report / "metrics.json").read_text())
        summary["step_log"] = pd.read_csv(report / "steps.csv").drop(columns="step").to_dict("records")
        return summary
    return None


def test_hce_joint_with_em_rounds(workspace, capsys):
    summary = run_with_train(
        workspace, "ingest", "querygen", "cluster", "train",
        method="hce", max_steps=4, hce={"mode": "J", "rounds": 2, "patience": 2, "n_negatives": 2, "alpha": 0.3},
    )
    assert summary["steps"] == 4
    assert [r["round"] for r in summary["rounds"]] == [0, 1, 2]
    devs = [r["dev"] for r in summary["rounds"]]
    assert [r["reclustered"] for r in summary["rounds"][1:]] == [d > max(devs[:i]) for i, d in enumerate(devs) if i]
    assert summary["dev_best"] == max(devs)
    for step in summary["step_log"]:  # Eq. 7: J = L_S + alpha * L_U, each the sum of its levels (Eq. 6)
        levels = {k: v for k, v in step.items() if ".level_" in k}
        assert len(levels) == 2 * 3  # both streams, every level of the depth-3 tree
        supervised = sum(v for k, v in levels.items() if k.startswith("supervised."))
        unsupervised = sum(v for k, v in levels.items() if k.startswith("unsupervised."))
        assert step["loss"] == pytest.approx(supervised + 0.3 * unsupervised, rel=1e-5)
    layout = Layout(workspace)
    assert (layout.final_tree / "tree.npz").exists()
    assert json.loads((layout.final_tree / "stats.json").read_text())["documents"] == 48
    assert main(["tree-info", str(layout.final_tree)]) == 0
    assert "documents: 48" in capsys.readouterr().out


@pytest.mark.parametrize(("mode", "parts"), [
    ("U", {"unsupervised.level_1", "unsupervised.level_2", "unsupervised.level_3"}),
    ("S", {"supervised.level_1", "supervised.level_2", "supervised.level_3"}),
    ("CT", {"supervised", "unsupervised"}),  # +CT: the plain in-batch loss per stream, no level terms
])
def test_hce_modes(workspace, mode, parts):
    summary = run_with_train(workspace, "ingest", "querygen", "cluster", "train", method="hce", max_steps=2,
                         hce={"mode": mode, "negatives": "encode", "alpha": 0.25})
    assert summary["steps"] == 2 and np.isfinite(summary["final_loss"])
    weight = {"supervised": 1.0, "unsupervised": 0.25 if mode == "CT" else 1.0}  # alpha weighs U only beside S
    for step in summary["step_log"]:
        assert set(step) - {"loss", "lr"} == parts
        assert step["loss"] == pytest.approx(sum(weight[k.split(".")[0]] * step[k] for k in parts), rel=1e-5)


@pytest.mark.parametrize("negatives", ["cached", "encode"])
def test_hce_joint_without_sampled_negatives(workspace, negatives):
    """n_NS = 0 keeps the centroid levels and the in-batch contrast (the benchmark's nns0 ablation)."""
    summary = run_with_train(workspace, "ingest", "querygen", "cluster", "train", method="hce", max_steps=2,
                         hce={"mode": "J", "n_negatives": 0, "negatives": negatives})
    assert summary["steps"] == 2 and np.isfinite(summary["final_loss"])


def _global_batch():
    """Four pairs, two of them one query relevant to two documents that land on different ranks."""
    docs = ["astronomy-1", "cooking-2", "finance-3", "music-4"]
    queries = ["question about astronomy-1", "question about cooking-2", "question about astronomy-1", "question about music-4"]
    return with_positives(pd.DataFrame({"query": queries, "doc_id": docs}))


def _objective(model_dir, tree_dir, device: torch.device | None = None):
    """The objective on ``device``: the CPU where a result is compared with an fp32 computation or
    with gloo ranks (bf16 autocast on CUDA would not match; two ranks cannot share one GPU)."""
    from model_code.hierarchy.tree import CorpusTree

    torch.manual_seed(0)
    encoder = Encoder(str(model_dir), device=device or torch.device("cpu"))
    encoder.eval()  # no dropout: both runs must compute the same function
    tree = CorpusTree.load(tree_dir / "tree.npz")
    loss = HCELoss(tree, levels_trained=1, temperature=0.05, n_negatives=2).to(encoder.device)
    cache = torch.as_tensor(np.load(tree_dir / "embeddings.npy"))
    stream = Stream("supervised", itertools.repeat(_global_batch()), 1.0)
    passages = [f"document text of {d}" for d in tree.doc_ids]
    objective = HCEObjective(encoder, loss, [stream], tree.doc_ids, passages, cache, False, 16, 16, torch.Generator().manual_seed(5))
    return encoder, loss, objective


def _worker(rank, world, store, model_dir, tree_dir, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    encoder, loss_fn, objective = _objective(model_dir, tree_dir)
    loss, _ = objective()
    loss.backward()
    params = [*encoder.parameters(), *loss_fn.parameters()]
    average_gradients(params)  # what DDP does for the encoder, and the trainer for centroids
    total = loss.detach().clone()
    dist.all_reduce(total)
    torch.save({"loss": total / world, "grads": [p.grad for p in params]}, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture
def tree_dir(tmp_path):
    """A small equal-depth tree (and its embeddings) over 24 document ids of the tiny corpus."""
    rng = np.random.default_rng(0)
    doc_ids = [f"{t}-{i}" for t in ("astronomy", "cooking", "finance", "music") for i in range(6)]
    vectors = rng.normal(size=(len(doc_ids), 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    directory = tmp_path / "tree"
    directory.mkdir()
    build_tree(doc_ids, vectors, branching=3, niter=5, seed=0).save(directory / "tree.npz")
    np.save(directory / "embeddings.npy", vectors)
    return directory


def test_two_rank_gloo_matches_single_process(tmp_path, tiny_model_dir, tree_dir):
    encoder, loss_fn, objective = _objective(tiny_model_dir, tree_dir)
    loss, _ = objective()
    loss.backward()
    reference = [p.grad for p in [*encoder.parameters(), *loss_fn.parameters()]]

    mp.spawn(_worker, args=(2, tmp_path / "store", tiny_model_dir, tree_dir, tmp_path), nprocs=2, join=True)
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(result["loss"], loss.detach(), atol=1e-5)
        for got, want in zip(result["grads"], reference):
            if want is None:
                assert got is None
            else:
                assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_stream_outside_hierarchy_streams_trains_as_ct(tiny_model_dir, tree_dir):
    """HCE-J with the tree's terms on one stream only: the other gets exactly +CT's loss."""
    encoder, loss_fn, hce = _objective(tiny_model_dir, tree_dir)
    hce.streams = [Stream("unsupervised", itertools.repeat(_global_batch()), 0.5, hierarchical=False)]
    ct = ContrastiveObjective(encoder, [Stream("unsupervised", itertools.repeat(_global_batch()), 0.5)],
                              hce.passage_text, loss_fn.temperature, 16, 16)
    (plain, plain_parts), (want, want_parts) = hce(), ct()
    assert torch.allclose(plain, want) and plain_parts == want_parts
    # and both are 0.5 x Eq. 8 by hand, without the pair of rows that share a query (0 and 2)
    batch = _global_batch()
    with torch.no_grad():
        q = encoder(encoder.tokenize(batch["query"].tolist(), 16)).double()
        p = encoder(encoder.tokenize([hce.passage_text(d) for d in batch["doc_id"]], 16)).double()
    s = (q @ p.T / loss_fn.temperature).tolist()
    shared = {(0, 2), (2, 0)}

    def nll(i, row):
        return -row[i] + np.log(sum(np.exp(x) for j, x in enumerate(row) if (i, j) not in shared))

    by_hand = np.mean([nll(i, s[i]) for i in range(4)]) + np.mean([nll(i, [s[j][i] for j in range(4)]) for i in range(4)])
    assert plain.item() == pytest.approx(0.5 * by_hand, rel=1e-4)
    hce.streams[0].hierarchical = True  # the same batch with the centroid levels and sampled negatives
    tree_loss, tree_parts = hce()
    assert not torch.allclose(tree_loss, want) and set(tree_parts) > {"unsupervised.level_1"}


def test_hce_joint_with_tree_terms_on_supervised_stream_only(workspace):
    summary = run_with_train(workspace, "ingest", "querygen", "cluster", "train", method="hce", max_steps=2,
                         hce={"mode": "J", "hierarchy_streams": ["supervised"]})
    assert summary["steps"] == 2 and np.isfinite(summary["final_loss"])


def test_hierarchy_streams_must_name_one_of_the_modes_streams(workspace, capsys):
    run_with_train(workspace, "ingest", "querygen", "cluster", method="hce", hce={"mode": "S", "hierarchy_streams": ["unsupervised"]})
    assert main(["train", "--params", str(workspace / "params.yaml"), "--root", str(workspace)]) == 2
    assert "hierarchy_streams ['unsupervised'] names none of mode S's streams" in capsys.readouterr().err


class ScriptedScorer:
    """Dev scores in a fixed order (first = the starting encoder), random corpus embeddings."""

    def __init__(self, scores, n_docs, seed=0):
        self.scores, self.n_docs, self.calls, self.seed = list(scores), n_docs, 0, seed
        self.returned = []  # (score, corpus embeddings) per call

    def score_encoder(self, encoder, params, passage_length, corpus_embeddings=None):
        self.calls += 1
        vectors = np.random.default_rng(self.seed + self.calls).normal(size=(self.n_docs, 32)).astype(np.float32)
        self.returned.append((self.scores.pop(0), vectors / np.linalg.norm(vectors, axis=1, keepdims=True)))
        return self.returned[-1]


@pytest.mark.parametrize(
    ("scores", "patience", "expected"),
    [
        ([0.5, 0.6, 0.55, 0.7], 2, [True, False, True]),  # re-cluster exactly when dev improves
        ([0.5, 0.4, 0.3, 0.9], 1, [False]),  # early stop after one round without improvement
    ],
)
def test_em_reclustering_trigger(workspace, scores, patience, expected):
    from model_code.config import load_params
    from model_code.data.ingested import load_ingested
    from model_code.hierarchy.tree import CorpusTree
    from model_code.methods.hce.training import train_hce

    run_with_train(workspace, "ingest", "querygen", "cluster")
    params = load_params(workspace / "params.yaml", {"train": {"method": "hce", "max_steps": 3,
                                                              "hce": {"mode": "S", "rounds": 3, "patience": patience}}})
    layout = Layout(workspace)
    data = load_ingested(layout.ingested)
    tree = CorpusTree.load(layout.hierarchy / "tree.npz")
    encoder = Encoder(params.encoder.model)
    scorer = ScriptedScorer(scores, 48)
    summary, final = train_hce(encoder, tree, np.load(layout.hierarchy / "embeddings.npy"), data, None,
                               params.train, params.hierarchy, params.encoder, scorer=scorer)
    assert [r["reclustered"] for r in summary["rounds"][1:]] == expected
    assert summary["dev_best"] == max(scores[: len(expected) + 1])
    assert (final is not tree) == any(expected)
    if any(expected):  # Alg. 3's E-step: the tree of the *current* encoder's fresh corpus embeddings, at the
        # indexing length (the dev scorer's are at train.max_passage_length); the last round improved, so the
        # encoder kept is the one that re-clustered last
        assert expected[-1] and params.encoder.max_passage_length != params.train.max_passage_length
        fresh = encoder.encode(data.passages(), params.encoder.max_passage_length)
        h = params.hierarchy
        want = build_tree(tree.doc_ids, fresh, h.branching_for(48), h.niter, h.seed, h.builder)
        assert np.array_equal(final.doc_path, want.doc_path)
        assert all(np.allclose(a, b) for a, b in zip(final.centroids, want.centroids))
        assert not np.array_equal(final.doc_path, tree.doc_path)


def _em_worker(rank, world, store, workspace, out_dir):
    """HCE training under 2 ranks whose dev scores and corpus embeddings disagree (as GPU runs may)."""
    from model_code.config import load_params
    from model_code.data.ingested import load_ingested
    from model_code.hierarchy.tree import CorpusTree
    from model_code.methods.hce.training import train_hce

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    params = load_params(workspace / "params.yaml", {"train": {"method": "hce", "max_steps": 2,
                                                              "hce": {"mode": "S", "rounds": 2, "patience": 2}}})
    layout = Layout(workspace)
    scorer = ScriptedScorer([0.5, 0.6, 0.7] if rank == 0 else [0.5, 0.4, 0.3], 48, seed=10 * rank)
    summary, tree = train_hce(Encoder(params.encoder.model, device=torch.device("cpu")), CorpusTree.load(layout.hierarchy / "tree.npz"),
                              np.load(layout.hierarchy / "embeddings.npy"), load_ingested(layout.ingested), None,
                              params.train, params.hierarchy, params.encoder, scorer=scorer)
    torch.save({"rounds": summary["rounds"], "doc_path": tree.doc_path}, out_dir / f"em{rank}.pt")
    dist.destroy_process_group()


def test_em_decisions_and_trees_come_from_rank_0(tmp_path, workspace):
    run_with_train(workspace, "ingest", "querygen", "cluster")
    mp.spawn(_em_worker, args=(2, tmp_path / "store", workspace, tmp_path), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"em{rank}.pt", weights_only=False) for rank in range(2)]
    for result in ranks:  # rank 0's scores improve every round: both ranks re-cluster twice
        assert [(r["dev"], r["reclustered"]) for r in result["rounds"]] == [(0.5, True), (0.6, True), (0.7, True)]
    assert np.array_equal(ranks[0]["doc_path"], ranks[1]["doc_path"])


def test_training_steps_lower_the_hce_loss(tiny_model_dir, tree_dir):
    """On the GPU where there is one (bf16 autocast): the centroids follow the encoder's device."""
    encoder, loss_fn, objective = _objective(tiny_model_dir, tree_dir, best_device())
    optimizer = torch.optim.AdamW([*encoder.parameters(), *loss_fn.parameters()], lr=1e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss, _ = objective()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("centroid_rate", [None, 0.1])
def test_centroids_train_at_their_own_learning_rate(centroid_rate):
    """Extra parameters (HCE centroids) follow the shared schedule from their own peak rate: Adam's
    first step moves every coordinate by about the rate, so each tensor's step shows its rate."""
    torch.manual_seed(0)
    model, centroids = torch.nn.Linear(4, 4), torch.nn.Parameter(torch.randn(3, 4))
    params = TrainParams(learning_rate=1e-3, warmup_ratio=0.0, weight_decay=0.0, grad_clip=1e9, max_steps=4)
    trainer = Trainer(model, params, total_steps=4)
    trainer.add_parameters([centroids], centroid_rate)
    before_w, before_c = model.weight.detach().clone(), centroids.detach().clone()
    x = torch.randn(8, 4)
    trainer.train(lambda: ((model(x) @ centroids.T).square().mean(), {}), steps=2)
    factors = [1.0, 0.75]  # linear decay over 4 steps, no warm-up
    expected = sum(factors) * (centroid_rate or params.learning_rate)
    assert (centroids - before_c).abs().max().item() == pytest.approx(expected, rel=0.02)
    assert (model.weight - before_w).abs().max().item() == pytest.approx(sum(factors) * 1e-3, rel=0.02)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([0.75e-3, 0.75 * expected / 1.75])
