"""Contrastive fine-tuning loop for the bi-encoder (CPU or CUDA, bf16 autocast on CUDA).

Plain PyTorch on purpose: the loop is short, and it reports progress through a callback so the
caller (DVC CLI or Dagster asset) decides where metrics go; this module imports neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from model_code.config import TrainParams
from model_code.losses.contrastive import bidirectional_infonce
from model_code.models.encoder import Encoder
from model_code.training.pairs import batches

StepCallback = Callable[[int, dict[str, float]], None]


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def train_contrastive(
    encoder: Encoder,
    pairs: pd.DataFrame,
    passage_text: dict[str, str],
    params: TrainParams,
    max_query_length: int,
    on_step: StepCallback | None = None,
) -> dict:
    """Fine-tune ``encoder`` in place on (query, positive doc_id) ``pairs``; return a summary."""
    seed_everything(params.seed)
    encoder.train()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=params.learning_rate, weight_decay=params.weight_decay)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, int(params.warmup_ratio * params.max_steps), params.max_steps
    )
    stream = batches(pairs, params.batch_size, params.seed)
    losses = []
    start = time.perf_counter()
    progress = tqdm(range(1, params.max_steps + 1), desc="training", unit="step")
    for step in progress:
        batch = next(stream)
        queries = encoder(encoder.tokenize(batch["query"].tolist(), max_query_length))
        passages = encoder(
            encoder.tokenize([passage_text[d] for d in batch["doc_id"]], params.max_passage_length)
        )
        loss = bidirectional_infonce(queries, passages, params.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), params.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        progress.set_postfix(loss=f"{losses[-1]:.4f}")
        if on_step is not None:
            on_step(step, {"loss": losses[-1], "lr": scheduler.get_last_lr()[0]})
    encoder.eval()
    elapsed = time.perf_counter() - start
    return {
        "steps": params.max_steps,
        "pairs": len(pairs),
        "first_loss": losses[0],
        "final_loss": sum(losses[-5:]) / len(losses[-5:]),
        "seconds": elapsed,
        "examples_per_second": params.max_steps * params.batch_size / elapsed,
        "loss_history": losses,
    }
