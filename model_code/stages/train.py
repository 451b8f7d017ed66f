"""Stage 4, training: fine-tune the encoder with the bidirectional in-batch contrastive loss.

Training data per ``train.data``: ``supervised`` (train qrels), ``unsupervised`` (the ICT
pseudo-queries) or ``joint`` (both). With ``train.enabled: false`` the loaded encoder is saved
unchanged (zero-shot). Outputs: the Hugging Face model directory ``Layout.encoder`` and
``reports/train/metrics.json`` + ``loss.csv``.
"""

from __future__ import annotations

import json
import logging

import pandas as pd

from model_code.config import EncoderParams, TrainParams
from model_code.data.ingested import IngestedData
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.encoder import Encoder
from model_code.training.loop import StepCallback, train_contrastive
from model_code.training.pairs import pseudo_pairs, supervised_pairs

log = logging.getLogger(__name__)


def training_pairs(params: TrainParams, data: IngestedData, pseudo_queries: pd.DataFrame | None) -> pd.DataFrame:
    parts = []
    if params.data in ("supervised", "joint"):
        parts.append(supervised_pairs(data))
    if params.data in ("unsupervised", "joint"):
        if pseudo_queries is None:
            raise ValueError(f"train.data={params.data} needs the pseudo-queries of the querygen stage")
        parts.append(pseudo_pairs(pseudo_queries))
    return pd.concat(parts, ignore_index=True)


def run(
    params: TrainParams,
    encoder_params: EncoderParams,
    data: IngestedData,
    pseudo_queries: pd.DataFrame | None,
    layout: Layout,
    on_step: StepCallback | None = None,
) -> dict:
    encoder = Encoder(encoder_params.model, encoder_params.pooling)
    if params.enabled:
        pairs = training_pairs(params, data, pseudo_queries)
        passage_text = dict(zip(data.corpus["doc_id"], data.passages()))
        summary = train_contrastive(encoder, pairs, passage_text, params, encoder_params.max_query_length, on_step)
    else:
        log.info("train.enabled is false: saving %s unchanged (zero-shot)", encoder_params.model)
        summary = {"steps": 0, "loss_history": []}
    history = summary.pop("loss_history")
    with atomic_path(layout.encoder) as out:
        encoder.save(out)
    with atomic_path(layout.train_report) as out:
        out.mkdir()
        (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
        pd.DataFrame({"step": range(1, len(history) + 1), "loss": history}).to_csv(out / "loss.csv", index=False)
    return summary
