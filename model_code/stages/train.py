"""Stage 4, training: fine-tune the encoder.

``train.method``:

* ``contrastive``: the bidirectional in-batch contrastive loss on ``train.data`` (supervised
  train qrels, unsupervised ICT pseudo-queries, or joint).
* ``hce``: the Hierarchical Corpus Encoder (``methods/hce/training.py``, the recipe's
  ``own_training``) against the corpus tree of the cluster stage, with EM re-clustering;
  ``train.hce.mode`` picks U, S, J or the CT baseline.

Either adds ``train.hard_negatives`` mined negatives per query (the mine-negatives stage) to the
candidates of every step. What is trained, with which contrastive objective, and which methods
apply is the retriever kind's training recipe (``Retriever.training_recipe``,
``training/recipe.py``): the dense encoder by default; MLR's multi-layer documents and SVDR's sparse
encoder bring their own. This stage names no kind.

With ``encoder.shared_encoder: false`` the dense encoder is untied: queries train a copy of
``encoder.model`` of their own, saved in ``Layout.encoder / "query"``.

With ``train.dev_every`` above 0 the contrastive method keeps the encoder whose retriever scored
best on dev (``training/selection.py``) instead of the last one.

With ``train.enabled: false`` the loaded encoder is saved unchanged (zero-shot). Outputs: the
Hugging Face model directory ``Layout.encoder``, the final tree ``Layout.final_tree`` (the
cluster stage's tree after any EM re-clustering; written whenever the cluster stage has run) and ``reports/train/`` (metrics.json; steps.csv: loss, learning rate and per-level losses per step).
"""

from __future__ import annotations

import json
import logging

import pandas as pd

from model_code.config import Params, TrainParams
from model_code.data.ingested import IngestedData, load_ingested
from model_code.hierarchy.tree import CorpusTree
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.retrievers import kind_class
from model_code.stages import not_used
from model_code.training.distributed import rank_and_world, setup_from_env
from model_code.training.loop import Trainer, seed_everything
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import Stream
from model_code.training.pairs import batches, pseudo_pairs, supervised_pairs, with_positives
from model_code.training.recipe import ObjectiveInputs
from model_code.training.selection import DevScore, train_selecting_on_dev

log = logging.getLogger(__name__)


def contrastive_streams(params: TrainParams, data: IngestedData, pseudo_queries: pd.DataFrame | None) -> list[Stream]:
    """One stream of (query, positive) pairs; ``joint`` pools both sources into it."""
    parts = []
    if params.data in ("supervised", "joint"):
        parts.append(supervised_pairs(data))
    if params.data in ("unsupervised", "joint"):
        if pseudo_queries is None:
            raise ValueError(f"train.data={params.data} needs the pseudo-queries of the querygen stage")
        parts.append(pseudo_pairs(pseudo_queries))
    pairs = with_positives(pd.concat(parts, ignore_index=True))
    return [Stream(params.data, batches(pairs, params.batch_size, params.seed), 1.0)]


def hard_negatives(params: TrainParams, layout: Layout) -> HardNegatives | None:
    """The mine-negatives stage's pools, drawn from ``train.hard_negatives`` at a time (None when 0)."""
    if not params.hard_negatives:
        return None
    path = layout.hard_negatives / "negatives.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: train.hard_negatives is {params.hard_negatives} but no negatives were "
                                "mined; run the mine-negatives stage first")
    return HardNegatives(pd.read_parquet(path), params.hard_negatives, params.seed)


def log_progress(step: int, values: dict[str, float]) -> None:
    """Losses every tenth step in the log (the CLI's terminal, the Dagster run's log)."""
    if step % 10 == 0 or step == 1:
        log.info("step %d: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in values.items()))


def run(settings: Params, layout: Layout) -> dict:
    params, encoder_params = settings.train, settings.encoder
    kind = kind_class(settings.retriever.kind)
    if not kind.uses_encoder:
        reason = f"retriever.kind {settings.retriever.kind} uses no encoder: nothing to train"
        for directory in (layout.encoder, layout.final_tree):
            not_used(directory, reason)
        summary = {"steps": 0, "used": False, "reason": reason}
        _write_report(layout, summary, pd.DataFrame(columns=["loss"]))
        return summary
    recipe_class = kind.training_recipe()
    if params.enabled and params.method not in recipe_class.methods:
        raise ValueError(f"retriever.kind {settings.retriever.kind} trains under train.method "
                         f"{' or '.join(recipe_class.methods)}, not {params.method}")
    data = load_ingested(layout.ingested)
    pseudo_queries = pd.read_parquet(layout.pseudo_queries) if layout.pseudo_queries.exists() else None
    setup_from_env()  # joins the process group under torchrun; nothing otherwise
    recipe = recipe_class(settings)
    encoder = recipe.encoder
    tree_file = layout.hierarchy / "tree.npz"
    tree = CorpusTree.load(tree_file) if tree_file.exists() else None

    if not params.enabled:
        log.info("train.enabled is false: saving %s unchanged (zero-shot)", encoder_params.model)
        summary = {"steps": 0, "step_log": []}
    elif params.method in recipe.own_training:  # a method that trains its own way (hce: EM against the tree)
        summary, tree = recipe.own_training[params.method](settings, layout, encoder, tree, data, pseudo_queries,
                                                           hard_negatives(params, layout), log_progress)
    else:
        seed_everything(params.seed)
        inputs = ObjectiveInputs(contrastive_streams(params, data, pseudo_queries),
                                 dict(zip(data.corpus["doc_id"], data.passages())), params.temperature,
                                 encoder_params.max_query_length, params.max_passage_length,
                                 hard_negatives(params, layout), params.seed)
        trainer = Trainer(encoder, params, params.max_steps, log_progress)
        objective = recipe.objective(inputs, trainer)
        if params.dev_every:
            score = DevScore(settings, data, recipe.save, layout.scratch)
            selection = train_selecting_on_dev(trainer, objective, params.dev_every, score, recipe.modules())
        else:
            trainer.train(objective, params.max_steps)
            selection = {}
        summary = {**trainer.summary(params.batch_size), **selection}
    summary.update(recipe.summary(), world_size=rank_and_world()[1])  # processes that trained (torchrun: all ranks)
    step_log = pd.DataFrame(summary.pop("step_log"))
    if rank_and_world()[0] != 0:  # under torchrun only rank 0 writes the outputs
        return summary
    with atomic_path(layout.encoder) as out:
        recipe.save(out)
    if tree is not None:
        with atomic_path(layout.final_tree) as out:
            out.mkdir()
            tree.save(out / "tree.npz")
            (out / "stats.json").write_text(json.dumps(tree.stats(), indent=2) + "\n")
    else:  # the cluster stage made no tree (kind svdr): the stage's declared output still exists
        not_used(layout.final_tree, f"no corpus tree in {layout.hierarchy} (retriever.kind {settings.retriever.kind})")
    _write_report(layout, summary, step_log)
    return summary


def _write_report(layout: Layout, summary: dict, step_log: pd.DataFrame) -> None:
    with atomic_path(layout.train_report) as out:
        out.mkdir()
        (out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        step_log.insert(0, "step", range(1, len(step_log) + 1))
        step_log.to_csv(out / "steps.csv", index=False)
