"""The training loop shared by every method: optimiser, schedule, accumulation, clipping.

What is optimised is an *objective*: a callable that draws its own batches and returns the loss
(and named parts for logging). Plain contrastive training and HCE are objectives
(``objectives.py``, ``methods/hce/objective.py``); this module owns only the mechanics, and reports through a callback so the
caller (DVC CLI or Dagster asset) decides where metrics go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from tqdm.auto import tqdm

from model_code.config import TrainParams
from model_code.training.distributed import average_gradients, rank_and_world

Objective = Callable[[], tuple[torch.Tensor, dict[str, float]]]
StepCallback = Callable[[int, dict[str, float]], None]


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def make_optimizer(params: TrainParams, parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW (default) or Adafactor (no relative-step schedule: the trainer sets the rate)."""
    parameters = list(parameters)
    if params.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        optimizer = Adafactor(
            parameters, lr=params.learning_rate, weight_decay=params.weight_decay,
            scale_parameter=False, relative_step=False, warmup_init=False,
        )
    else:
        optimizer = torch.optim.AdamW(parameters, lr=params.learning_rate, weight_decay=params.weight_decay)
    return optimizer


def linear_schedule(step: int, total_steps: int, warmup_ratio: float) -> float:
    """Learning-rate factor: linear warm-up over ``warmup_ratio`` of the steps, then linear decay to 0.

    Applied to every parameter group each step, so groups added later (HCE centroids after a
    re-clustering) follow the same schedule."""
    warmup = int(warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup))


class Trainer:
    """Optimiser state that persists across calls to ``train`` (e.g. across HCE EM rounds)."""

    def __init__(self, model: torch.nn.Module, params: TrainParams, total_steps: int, on_step: StepCallback | None = None):
        self.model = model
        self.params = params
        self.extra: list[torch.nn.Parameter] = []
        self.optimizer = make_optimizer(params, model.parameters())
        self.total_steps = total_steps
        self.on_step = on_step
        self.step = 0
        self.history: list[dict[str, float]] = []  # per step: loss, lr and the objective's parts
        self.seconds = 0.0

    def add_parameters(self, parameters: Iterable[torch.nn.Parameter], learning_rate: float | None = None) -> None:
        """Train extra parameters (HCE centroids), no weight decay, at their own peak rate
        (default: the encoder's) on the shared schedule. A centroid is a unit vector: at an encoder's
        rate (~1e-5) it barely moves in a few hundred steps, so it may need a far larger one."""
        parameters = list(parameters)
        if parameters:
            self.extra.extend(parameters)
            peak = self.params.learning_rate if learning_rate is None else learning_rate
            self.optimizer.add_param_group({"params": parameters, "weight_decay": 0.0, "peak_lr": peak})

    def train(self, objective: Objective, steps: int, desc: str = "training") -> None:
        self.model.train()
        start = time.perf_counter()
        rank, _ = rank_and_world()
        for _ in tqdm(range(steps), desc=desc, unit="step", disable=rank != 0):
            factor = linear_schedule(self.step, self.total_steps, self.params.warmup_ratio)
            rate = self.params.learning_rate * factor
            for group in self.optimizer.param_groups:
                group["lr"] = group.get("peak_lr", self.params.learning_rate) * factor
            self.optimizer.zero_grad(set_to_none=True)
            total, parts = 0.0, {}
            for _ in range(self.params.grad_accumulation):
                loss, micro_parts = objective()
                (loss / self.params.grad_accumulation).backward()
                total += loss.item() / self.params.grad_accumulation
                for key, value in micro_parts.items():
                    parts[key] = parts.get(key, 0.0) + value / self.params.grad_accumulation
            average_gradients([*self.model.parameters(), *self.extra])  # the DDP all-reduce, explicit
            torch.nn.utils.clip_grad_norm_([*self.model.parameters(), *self.extra], self.params.grad_clip)
            self.optimizer.step()
            self.step += 1
            record = {"loss": total, "lr": rate, **parts}
            self.history.append(record)
            if self.on_step is not None:
                self.on_step(self.step, record)
        self.model.eval()
        self.seconds += time.perf_counter() - start

    def summary(self, batch_size: int) -> dict:
        tail = [h["loss"] for h in self.history[-5:]] or [float("nan")]
        return {
            "steps": self.step,
            "first_loss": self.history[0]["loss"] if self.history else None,
            "final_loss": sum(tail) / len(tail),
            "seconds": self.seconds,
            "examples_per_second": self.step * batch_size * self.params.grad_accumulation / max(self.seconds, 1e-9),
            "step_log": list(self.history),
        }
