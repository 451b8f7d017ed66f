"""Checkpoint selection on dev (``train.dev_every``, ``training/selection.py``): the legs share one
learning-rate schedule (checked against the formula by hand), the best score's state comes back
(the earliest of ties), and through the real train stage the saved encoder is the chosen one,
checked against what exists independently of the selection: the untouched starting model's
weights, the scalar mix's uniform start, and the evaluate stage's own dev score of the saved
output; two gloo ranks whose own scores disagree both keep the state rank 0 chose. A depth
that follows the dev metric's cutoff is checked against a brute-force recall."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from model_code.cli import main
from model_code.config import EncoderParams, Params, TrainParams
from model_code.data.ingested import load_ingested
from model_code.eval.dev import DevScorer
from model_code.methods.svdr.model import SparseEncoder
from model_code.models.encoder import Encoder
from model_code.training import selection
from model_code.training.loop import Trainer
from tests.conftest import run_stages, tiny_params

STAGES = ("ingest", "querygen", "mine-negatives", "cluster", "train")


def scripted(values):
    """A score function returning ``values`` in turn, recording the weights it was called with."""
    seen = []

    def score(modules):
        seen.append([{k: v.clone() for k, v in m.state_dict().items()} for m in modules])
        return values[len(seen) - 1]

    return score, seen


def test_legs_follow_one_schedule_and_the_best_state_of_every_module_comes_back():
    torch.manual_seed(0)
    model, extra = torch.nn.Linear(2, 1), torch.nn.Linear(1, 1)
    x, y = torch.tensor([[1.0, 2.0], [3.0, -1.0]]), torch.tensor([[1.0], [0.0]])
    params = TrainParams(max_steps=5, learning_rate=0.1, warmup_ratio=0.0, weight_decay=0.0, grad_clip=100.0)
    trainer = Trainer(model, params, params.max_steps)
    trainer.add_parameters(extra.parameters())

    def objective():
        return ((extra(model(x)) - y) ** 2).mean(), {}

    score, seen = scripted([0.2, 0.9, 0.5, 0.9])  # steps 0, 2, 4, 5: 0.9 twice, the earlier wins
    result = selection.train_selecting_on_dev(trainer, objective, 2, lambda: score([model, extra]), [model, extra])

    assert [s["step"] for s in result["dev_scores"]] == [0, 2, 4, 5]
    assert [s["dev"] for s in result["dev_scores"]] == [0.2, 0.9, 0.5, 0.9]
    assert (result["best_step"], result["dev_best"]) == (2, 0.9)
    assert trainer.step == 5
    # warm-up 0, linear decay over all five steps: 0.1 * (5 - step) / 5, uninterrupted by the legs
    assert [h["lr"] for h in trainer.history] == pytest.approx([0.1, 0.08, 0.06, 0.04, 0.02], abs=1e-12)
    for module, state in zip([model, extra], seen[1]):
        for key, value in module.state_dict().items():
            assert torch.equal(value, state[key]), key
    assert not torch.equal(seen[1][0]["weight"], seen[3][0]["weight"])  # training moved them after step 2


def test_an_exact_number_of_legs_scores_once_at_the_end():
    model = torch.nn.Linear(1, 1)
    trainer = Trainer(model, TrainParams(max_steps=4), 4)
    score, seen = scripted([0.1, 0.2, 0.3])
    result = selection.train_selecting_on_dev(trainer, lambda: (model(torch.ones(1, 1)).sum(), {}), 2,
                                              lambda: score([model]), [model])
    assert [s["step"] for s in result["dev_scores"]] == [0, 2, 4] and result["best_step"] == 4
    assert len(seen) == 3  # no second score of the last state


def _ranked_worker(rank, world, store, out_dir):
    """Two gloo ranks train the same linear model; rank 1's own scores would choose another step."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    trainer = Trainer(model, TrainParams(max_steps=2, learning_rate=0.1, warmup_ratio=0.0), 2)
    score, seen = scripted([0.1, 0.9, 0.2] if rank == 0 else [0.9, 0.1, 0.2])
    result = selection.train_selecting_on_dev(trainer, lambda: (model(torch.ones(1, 2)).pow(2).sum(), {}), 1,
                                              lambda: score([model]), [model])
    torch.save({"result": result, "weight": model.weight.detach(), "calls": len(seen),
                "chosen": seen[1][0]["weight"] if seen else None}, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_rank_0_alone_scores_and_every_rank_keeps_the_state_it_chose(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_ranked_worker, args=(2, tmp_path / "store", tmp_path), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    assert [r["calls"] for r in ranks] == [3, 0]  # rank 1 never builds a retriever
    for saved in ranks:
        assert [s["dev"] for s in saved["result"]["dev_scores"]] == [0.1, 0.9, 0.2]  # rank 0's numbers
        assert saved["result"]["best_step"] == 1
        assert torch.equal(saved["weight"], ranks[0]["chosen"])


def test_a_rank_other_than_0_takes_the_broadcast_score_without_scoring(monkeypatch):
    """In process (mutation tools follow no spawned rank): as rank 1 of 2 the score function is
    never called, what reaches the broadcast is None, and the state kept is the one rank 0's
    numbers choose (stand-in broadcast: 0.1, 0.9, 0.2 for steps 0, 1, 2)."""
    sent, broadcast = [], iter([0.1, 0.9, 0.2])
    monkeypatch.setattr(selection, "rank_and_world", lambda: (1, 2))
    monkeypatch.setattr(selection, "from_rank0", lambda value: sent.append(value) or next(broadcast))
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    trainer = Trainer(model, TrainParams(max_steps=2, learning_rate=0.1, warmup_ratio=0.0), 2)
    kept = []
    trainer_train = trainer.train

    def train_and_record(*args, **kwargs):
        kept.append(model.weight.detach().clone())
        return trainer_train(*args, **kwargs)

    trainer.train = train_and_record
    result = selection.train_selecting_on_dev(trainer, lambda: (model(torch.ones(1, 2)).pow(2).sum(), {}), 1,
                                              lambda: pytest.fail("rank 1 scored"), [model])
    assert sent == [None, None, None]
    assert result["best_step"] == 1
    assert torch.equal(model.weight, kept[1])  # the weights after step 1, before the second leg trained


def test_each_score_saves_its_scratch_copy_under_the_workspace_cache_and_removes_it(
        tmp_path, beir_dir, tiny_model_dir, monkeypatch):
    """The encoder a score builds from goes to the workspace's ``.cache`` (the disk the workspace is
    on, not the system temp folder), a fresh folder per score, gone once the score is taken."""
    folders, original = [], selection.Layout

    def recording(folder):
        folders.append(Path(folder))
        return original(folder)

    monkeypatch.setattr(selection, "Layout", recording)
    params = tiny_params(beir_dir, tiny_model_dir, train={"dev_every": 1, "max_steps": 2})
    layout = run_stages(tmp_path / "ws", params, *STAGES)
    assert len(set(folders)) == 3  # steps 0, 1 and 2
    assert all(folder.parent == layout.root / ".cache" and not folder.exists() for folder in folders)


def test_a_diverged_score_never_wins():
    model = torch.nn.Linear(1, 1)
    trainer = Trainer(model, TrainParams(max_steps=2), 2)
    score, _ = scripted([float("nan"), 0.2, 0.1])
    result = selection.train_selecting_on_dev(trainer, lambda: (model(torch.ones(1, 1)).sum(), {}), 1,
                                              lambda: score([model]), [model])
    assert (result["best_step"], result["dev_best"]) == (1, 0.2)


@pytest.fixture
def spied_scores(monkeypatch):
    """Run the real dev score, record it, and return the next scripted value instead, so that the
    test decides which state the selection must keep."""
    real, script = [], []
    original = selection.DevScore.__call__

    def spy(self):
        real.append(original(self))
        return script[len(real) - 1]

    monkeypatch.setattr(selection.DevScore, "__call__", spy)
    return real, script


def test_the_train_stage_saves_the_state_chosen_on_dev_which_the_evaluate_stage_scores_on_dev(
        tmp_path, beir_dir, tiny_model_dir, spied_scores):
    real, script = spied_scores
    script.extend([0.0, 0.2, 0.9, 0.1])  # steps 0..3: the state after step 2 is kept
    params = tiny_params(beir_dir, tiny_model_dir, train={"dev_every": 1, "learning_rate": 5e-3})
    layout = run_stages(tmp_path / "ws", params, *STAGES)
    report = json.loads((layout.train_report / "metrics.json").read_text())
    assert [s["step"] for s in report["dev_scores"]] == [0, 1, 2, 3]
    assert (report["best_step"], report["dev_best"], report["steps"]) == (2, 0.9, 3)

    params["eval"]["split"] = "dev"
    run_stages(layout.root, params, "index", "evaluate")
    evaluated = json.loads((layout.eval_report / "metrics.json").read_text())
    assert evaluated["split"] == "dev"
    assert evaluated["ndcg@10"] == pytest.approx(real[2], abs=1e-6)
    assert real[2] != pytest.approx(real[3], abs=1e-6)  # else keeping the last state would pass as well


def safetensors_equal(a, b) -> None:
    saved, start = load_file(a), load_file(b)
    assert saved.keys() == start.keys()
    for key in start:
        assert torch.equal(saved[key], start[key]), key


@pytest.mark.parametrize("kind, settings, encoder, scored_as", [
    ("mlr", {"layers": [2, 1], "pooling": "scalar_mix", "mix_learning_rate": 0.5}, {}, "mlr"),
    ("svdr", {"search": "full"}, {}, "svdr"),
    ("svdr", {"search": "full", "shared_encoder": False}, {}, "svdr"),
    ("dense", {}, {"shared_encoder": False}, "dense"),
    ("incdsi", {"tune_trials": 3, "tune_share": 0.2}, {}, "dense"),  # scored through its encoder's dense index
])
def test_a_state_chosen_before_training_is_the_starting_model_in_every_encoder_kind(
        tmp_path, beir_dir, tiny_model_dir, spied_scores, kind, settings, encoder, scored_as):
    """Scripted to keep the start: every saved side equals the tiny model's own file, the mix is
    uniform, SVDR's LayerNorms the identity; and the dev score taken then is what the index and
    evaluate stages give the saved encoder on dev, built as the kind scores it."""
    real, script = spied_scores
    script.extend([1.0, 0.5, 0.5])
    params = tiny_params(beir_dir, tiny_model_dir, train={"dev_every": 1, "max_steps": 2, "learning_rate": 5e-3})
    params["retriever"] = {**params["retriever"], "kind": kind, **({kind: settings} if settings else {})}
    params["encoder"].update(encoder)
    layout = run_stages(tmp_path / "ws", params, *STAGES)
    assert len(real) == 3
    if kind == "mlr":
        saved_mix = json.loads((layout.encoder / "scalar_mix.json").read_text())
        assert saved_mix["weights"] == pytest.approx([0.5, 0.5], abs=1e-7)  # softmax of equal logits, by hand
    if kind == "svdr":  # its LayerNorms start as the identity (SVDR §3.2)
        for norm in torch.load(layout.encoder / SparseEncoder.NORMS_FILE).values():
            assert torch.equal(norm["weight"], torch.ones(32)) and torch.equal(norm["bias"], torch.zeros(32))
    start = tiny_model_dir / "model.safetensors"
    safetensors_equal(layout.encoder / "model.safetensors", start)
    for side in ("query", SparseEncoder.PASSAGE_DIR):  # the untied encoders' second side
        if (layout.encoder / side).is_dir():
            safetensors_equal(layout.encoder / side / "model.safetensors", start)
    assert (layout.encoder / "query").is_dir() == (encoder == {"shared_encoder": False})

    params["retriever"]["kind"], params["eval"]["split"] = scored_as, "dev"
    run_stages(layout.root, params, "index", "evaluate")
    assert json.loads((layout.eval_report / "metrics.json").read_text())["ndcg@10"] == pytest.approx(real[0], abs=1e-6)


def test_the_dev_score_searches_as_deep_as_its_metric_cuts(tmp_path, beir_dir, tiny_model_dir, spied_scores):
    """recall@30 kept at the start, against the evaluate stage's recall@30 and recall@10 of the
    saved encoder on dev through an exact index: a score searched 10 deep would be the latter, and
    one searched through the approximate index the params name for serving (IVF, 1 of 4 lists
    probed: at most about a quarter of the 48 documents reachable) would miss most of the 30."""
    real, script = spied_scores
    script.extend([1.0, 0.5])
    params = tiny_params(beir_dir, tiny_model_dir, train={"dev_every": 1, "max_steps": 1, "dev_metric": "recall@30"})
    params["eval"].update(split="dev", top_k=48, metrics=["recall@10", "recall@30"])
    params["index"].update(factory="IVF4,Flat", nprobe=1)
    layout = run_stages(tmp_path / "ws", params, *STAGES)
    params["index"].update(factory="Flat")
    run_stages(layout.root, params, "index", "evaluate")
    evaluated = json.loads((layout.eval_report / "metrics.json").read_text())
    assert evaluated["recall@30"] == pytest.approx(real[0], abs=1e-6)
    assert evaluated["recall@30"] > evaluated["recall@10"]


@pytest.mark.parametrize("ignore", [True, False])
def test_the_dev_score_follows_beirs_rule_on_a_querys_own_document(tmp_path, tiny_model_dir, spied_scores, ignore):
    """On a corpus whose queries are also its documents (same id, same text) the dev score follows
    ``eval.ignore_identical_ids`` as evaluate does: MRR@10 kept at the start equals evaluate's on
    dev under the same setting and differs from it under the other (the own document, nearest of
    all, ranks first unless dropped). Both settings: the rule's default is on."""
    from tests.helpers.corpora import argument_corpus

    real, script = spied_scores
    script.extend([1.0, 0.5])
    beir = argument_corpus(tmp_path / "arguments")
    params = tiny_params(beir, tiny_model_dir, train={"dev_every": 1, "max_steps": 1, "dev_metric": "mrr@10", "batch_size": 2},
                         data={"source": "beir", "path": str(beir), "dev_fraction": 0.5},
                         hierarchy={"branching": 2, "niter": 2})
    params["eval"].update(split="dev", metrics=["mrr@10"], ignore_identical_ids=ignore)
    layout = run_stages(tmp_path / "ws", params, *STAGES, "index", "evaluate")
    assert json.loads((layout.eval_report / "metrics.json").read_text())["mrr@10"] == pytest.approx(real[0], abs=1e-6)
    params["eval"]["ignore_identical_ids"] = not ignore
    run_stages(layout.root, params, "evaluate")
    assert json.loads((layout.eval_report / "metrics.json").read_text())["mrr@10"] != pytest.approx(real[0], abs=1e-6)


def test_selection_without_a_dev_split_is_refused_naming_the_settings(tmp_path, beir_dir, tiny_model_dir, capsys):
    params = tiny_params(beir_dir, tiny_model_dir, train={"dev_every": 1})
    params["data"]["dev_fraction"] = 0.0
    layout = run_stages(tmp_path / "ws", params, *STAGES[:-1])
    assert main(["train", "--params", str(layout.root / "params.yaml"), "--root", str(layout.root)]) == 2
    assert re.search(r"dev split[\s\S]*data\.dev_fraction[\s\S]*train\.dev_every to 0", capsys.readouterr().err)
    assert not layout.encoder.exists()


def test_the_moved_hce_dev_metric_says_where_it_went():
    with pytest.raises(ValueError, match=r"train.hce.dev_metric moved to train.dev_metric"):
        Params.model_validate({"train": {"hce": {"dev_metric": "ndcg@10"}}})


def test_method_hce_is_refused_with_dev_every():
    with pytest.raises(ValueError, match="train.dev_every is for method contrastive"):
        Params.model_validate({"train": {"method": "hce", "dev_every": 10}})


def test_the_hce_dev_scorer_searches_as_deep_as_its_metric_cuts(tmp_path, beir_dir, tiny_model_dir):
    """recall@30 over 48 documents, against a brute-force ranking of the same embeddings: a scorer
    that searched 10 deep would miss every relevant document ranked 11th to 30th."""
    params = Params.model_validate(tiny_params(beir_dir, tiny_model_dir))
    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir), "ingest")
    data = load_ingested(layout.ingested)
    encoder = Encoder(str(tiny_model_dir))
    scorer = DevScorer(data, "recall@30", max_queries=500)
    got, corpus = scorer.score_encoder(encoder, EncoderParams(**params.encoder.model_dump()), 32)

    doc_ids = data.corpus["doc_id"].tolist()
    queries = encoder.encode(scorer.query_text, params.encoder.max_query_length, 16, side="query")
    order = np.argsort(-(queries @ corpus.T), axis=1, kind="stable")
    def recall(cut):
        found = []
        for row, query_id in zip(order, scorer.qrels):
            ranked = [doc_ids[i] for i in row if doc_ids[i] != query_id][:cut]
            found.append(len(set(ranked) & set(scorer.qrels[query_id])) / len(scorer.qrels[query_id]))
        return np.mean(found)

    assert got == pytest.approx(recall(30), abs=1e-6)
    assert recall(30) > recall(10)  # relevant documents ranked 11th to 30th count
