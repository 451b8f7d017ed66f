"""Checkpoint selection on dev for method contrastive: the encoder that deploys is the one whose
retriever scored best on the dev split (carved from train), not whatever the last step left.

Training runs in legs of ``train.dev_every`` steps on one schedule over ``train.max_steps`` (the
learning rate follows the same curve as uninterrupted training). Before the first leg and after
each one, the current encoder is saved into a scratch folder, the configured retriever kind is
built from it over the whole corpus (``Retriever.build_for_dev_selection``: MLR's multi-vector or
mixed index, SVDR's sparse one; IncDSI's dense index, its head being fitted once after training)
and searched with the dev queries as the evaluate stage searches test. Scoring the kind's own
build, not a dense stand-in, is what makes one rule fit every kind. Vectors are searched exactly
(exact search in process, whatever ``index`` says: ``stores.exact_settings``), so the choice depends on the encoder alone and not
on approximate-search settings, which can change without retraining. A score costs one corpus
encoding, so selection is off by default. The best state (the encoder and, for ``scalar_mix``, the
layer weights) is kept in CPU memory and put back at the end.
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from model_code.config import Params
from model_code.data.ingested import IngestedData
from model_code.eval.dev import DevScorer
from model_code.layout import Layout
from model_code.retrievers import kind_class
from model_code.stores import exact_settings
from model_code.training.distributed import from_rank0, rank_and_world
from model_code.training.loop import Objective, Trainer

log = logging.getLogger(__name__)


@dataclass
class DevScore:
    """The dev metric of the retriever an encoder makes, over every dev query: ``save`` writes the
    encoder (and whatever the kind loads beside it) into a directory, as the train stage saves its
    output; scratch copies go under ``scratch`` (the workspace's ``.cache``), one at a time."""

    settings: Params
    data: IngestedData
    save: Callable[[Path], None]
    scratch: Path

    def __post_init__(self) -> None:
        if "dev" not in self.data.qrels:
            raise ValueError("train.dev_every selects checkpoints on the dev split, and this corpus has none: set "
                             "data.dev_fraction above 0 (the share of train queries carved into dev) or "
                             "train.dev_every to 0")
        self.scorer = DevScorer(self.data, self.settings.train.dev_metric,
                                ignore_identical_ids=self.settings.eval.ignore_identical_ids,
                                top_k=self.settings.eval.top_k)
        exact = exact_settings(self.settings.index)
        self.build_settings = self.settings.model_copy(update={"index": exact})

    def __call__(self) -> float:
        self.scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="dev-selection-", dir=self.scratch) as folder:
            layout = Layout(folder)
            self.save(layout.encoder)
            kind = kind_class(self.settings.retriever.kind)
            retriever = kind.build_for_dev_selection(self.build_settings, self.data, layout)
            return self.scorer.score_retriever(retriever)


def _ranked(value: float) -> float:
    """A score as the selection compares it: NaN (a diverged encoder) below every number."""
    return -math.inf if math.isnan(value) else value


def train_selecting_on_dev(trainer: Trainer, objective: Objective, every: int, score: Callable[[], float],
                           modules: list[torch.nn.Module]) -> dict:
    """Train ``trainer.total_steps`` steps in legs of ``every``, scoring before the first leg and
    after each; ``modules`` end in the best-scoring state (the earliest of equal scores). Rank 0
    alone scores and every rank follows its number, so ranks keep one model (the others wait at the
    broadcast meanwhile). Returns the scores."""
    rank, _ = rank_and_world()
    legs = -(-trainer.total_steps // every)
    best, scores = None, []
    while True:
        value = from_rank0(score() if rank == 0 else None)
        scores.append({"step": trainer.step, "dev": value})
        log.info("step %d: dev %.4f%s", trainer.step, value, "" if best is None else f" (best {best[0]:.4f})")
        if best is None or _ranked(value) > _ranked(best[0]):
            best = (value, trainer.step, [{k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
                                          for m in modules])
        if trainer.step >= trainer.total_steps:
            break
        trainer.train(objective, min(every, trainer.total_steps - trainer.step),
                      desc=f"training, leg {trainer.step // every + 1}/{legs}")
    value, step, states = best
    for module, state in zip(modules, states):
        module.load_state_dict(state)
    return {"dev_best": value, "best_step": step, "dev_scores": scores}
