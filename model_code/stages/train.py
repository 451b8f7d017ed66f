"""Stage 4, training: fine-tune the encoder.

``train.method``:

* ``contrastive``: the bidirectional in-batch contrastive loss on ``train.data`` (supervised
  train qrels, unsupervised ICT pseudo-queries, or joint).
* ``hce``: the Hierarchical Corpus Encoder (``training/hce.py``) against the corpus tree of the
  cluster stage, with EM re-clustering; ``train.hce.mode`` picks U, S, J or the CT baseline.

Either adds ``train.hard_negatives`` mined negatives per query (the mine-negatives stage) to the
candidates of every step. With ``retriever.kind: mlr`` the contrastive method trains documents as
their multi-layer representations under ``retriever.mlr.pooling`` (``MLRObjective``), and a
scalar mix's weights are saved beside the encoder (uniform when nothing trained them). With
``retriever.kind: svdr`` it trains the sparse vocabulary encoder with SVDR's semi-parametric loss
(``SVDRObjective``, ``retriever.svdr.loss``), with ``retriever.svdr.retrieved_negatives`` negatives
per query retrieved each step from the corpus's binary token index, and saves it with its LayerNorms.

With ``encoder.shared_encoder: false`` the dense encoder is untied: queries train a copy of
``encoder.model`` of their own, saved in ``Layout.encoder / "query"``.

With ``train.dev_every`` above 0 the contrastive method keeps the encoder whose retriever scored
best on dev (``training/selection.py``) instead of the last one.

With ``train.enabled: false`` the loaded encoder is saved unchanged (zero-shot). Outputs: the
Hugging Face model directory ``Layout.encoder``, the final tree ``Layout.final_tree`` (the
cluster stage's tree after any EM re-clustering; written whenever the cluster stage has run) and ``reports/train/`` (metrics.json; steps.csv: loss, learning rate and per-level losses per step).
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from model_code.config import EncoderParams, Params, TrainParams
from model_code.data.ingested import IngestedData, load_ingested
from model_code.hierarchy.tree import CorpusTree
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.encoder import Encoder
from model_code.models.layer_mix import ScalarMix
from model_code.models.sparse_encoder import SparseEncoder
from model_code.models.token_bags import bag_of_tokens
from model_code.retrievers import kind_class
from model_code.retrievers.mlr import check_layers
from model_code.retrievers.svdr import SVDRSettings
from model_code.stages import not_used
from model_code.stores import exact_store
from model_code.training.distributed import rank_and_world, setup_from_env
from model_code.training.hce import train_hce
from model_code.training.loop import Trainer, seed_everything
from model_code.training.negatives import HardNegatives, RetrievedNegatives
from model_code.training.objectives import ContrastiveObjective, MLRObjective, Stream
from model_code.training.pairs import batches, pseudo_pairs, supervised_pairs, with_positives
from model_code.training.selection import DevScore, train_selecting_on_dev
from model_code.training.svdr import SVDRObjective

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


def retrieved_negatives(svdr: SVDRSettings, encoder: SparseEncoder, passages: dict[str, str], passage_length: int,
                        seed: int) -> RetrievedNegatives | None:
    """In-training negative retrieval over the corpus's binary token index, cut at the training
    passage length as the loss's bags of tokens are (None when ``retrieved_negatives`` is 0)."""
    if not svdr.retrieved_negatives:
        return None
    matrix = bag_of_tokens(encoder.tokenizer, list(passages.values()), passage_length, svdr.vocab_start,
                           encoder.vocab_size, desc="binary index for negatives")
    # a stream of its own: seeded as the mined draws, it would pick the same positions in its pools
    return RetrievedNegatives(exact_store(matrix, list(passages), "sparse"), svdr.retrieved_negatives,
                              svdr.retrieval_depth, seed + 1)


def dense_encoder(params: EncoderParams) -> Encoder:
    """``encoder.model`` with the tying ``encoder.shared_encoder`` asks for: untied, the query side
    starts as a copy of the model, or as the query side of a model saved untied; a model saved
    untied is refused for tied training rather than silently trained untied."""
    encoder = Encoder(params.model, params.pooling, untie=not params.shared_encoder)
    if encoder.shared != params.shared_encoder:
        raise ValueError(f"encoder.model {params.model} holds a separate query encoder (query/): set "
                         "encoder.shared_encoder to false to train it further")
    return encoder


def log_progress(step: int, values: dict[str, float]) -> None:
    """Losses every tenth step in the log (the CLI's terminal, the Dagster run's log)."""
    if step % 10 == 0 or step == 1:
        log.info("step %d: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in values.items()))


def run(settings: Params, layout: Layout) -> dict:
    params, encoder_params, hierarchy = settings.train, settings.encoder, settings.hierarchy
    if not kind_class(settings.retriever.kind).uses_encoder:
        reason = f"retriever.kind {settings.retriever.kind} uses no encoder: nothing to train"
        for directory in (layout.encoder, layout.final_tree):
            not_used(directory, reason)
        summary = {"steps": 0, "used": False, "reason": reason}
        _write_report(layout, summary, pd.DataFrame(columns=["loss"]))
        return summary
    data = load_ingested(layout.ingested)
    pseudo_queries = pd.read_parquet(layout.pseudo_queries) if layout.pseudo_queries.exists() else None
    setup_from_env()  # joins the process group under torchrun; nothing otherwise
    svdr = settings.retriever.settings("svdr") if settings.retriever.kind == "svdr" else None
    if svdr is not None and params.enabled and params.method != "contrastive":
        raise ValueError(f"retriever.kind svdr trains with its own loss under train.method contrastive, not {params.method}")
    if svdr is not None and not encoder_params.shared_encoder:
        raise ValueError("encoder.shared_encoder is for the dense encoder kinds; retriever.kind svdr unties its "
                         "sides with retriever.svdr.shared_encoder")
    encoder = (dense_encoder(encoder_params) if svdr is None
               else SparseEncoder(encoder_params.model, svdr.vocab_start, svdr.shared_encoder))
    mlr = settings.retriever.settings("mlr") if settings.retriever.kind == "mlr" else None
    if mlr is not None:
        check_layers(mlr, encoder.num_layers)
    mix = ScalarMix(mlr.layers).to(encoder.device) if mlr is not None and mlr.pooling == "scalar_mix" else None
    tree_file = layout.hierarchy / "tree.npz"
    tree = CorpusTree.load(tree_file) if tree_file.exists() else None

    def save_encoder(directory: Path) -> None:
        """The stage's output (and each dev score's retriever): the encoder, with the layer weights of a scalar mix."""
        encoder.save(directory) if svdr is not None else encoder.save(directory, encoder_params.max_passage_length)
        if mix is not None:
            mix.save(directory)

    if not params.enabled:
        log.info("train.enabled is false: saving %s unchanged (zero-shot)", encoder_params.model)
        summary = {"steps": 0, "step_log": []}
    elif params.method == "hce":
        if tree is None:
            raise FileNotFoundError(f"{tree_file}: HCE training needs the corpus tree; run the cluster stage first")
        embeddings = np.load(layout.hierarchy / "embeddings.npy")
        summary, tree = train_hce(encoder, tree, embeddings, data, pseudo_queries, params, hierarchy, encoder_params,
                                  log_progress, ignore_identical_ids=settings.eval.ignore_identical_ids,
                                  hard_negatives=hard_negatives(params, layout))
    else:
        seed_everything(params.seed)
        passages = dict(zip(data.corpus["doc_id"], data.passages()))
        common = (encoder, contrastive_streams(params, data, pseudo_queries), passages.__getitem__,
                  params.temperature, encoder_params.max_query_length, params.max_passage_length)
        query_forward = functools.partial(encoder, side="query")  # the query side (a tied encoder's only one)
        trainer = Trainer(encoder, params, params.max_steps, log_progress)
        if svdr is not None:
            _, streams, passage_text, _, query_length, passage_length = common  # temperature 1: SVDR's
            objective = SVDRObjective(encoder, streams, passage_text, query_length, passage_length, svdr.topk,
                                      svdr.loss, hard_negatives=hard_negatives(params, layout),
                                      retrieved=retrieved_negatives(svdr, encoder, passages, passage_length, params.seed))
        elif mlr is None:
            objective = ContrastiveObjective(*common, hard_negatives=hard_negatives(params, layout),
                                             query_forward=query_forward)
        else:
            objective = MLRObjective(*common, mlr.layers, mlr.pooling, mlr.reg_weight, mix,
                                     hard_negatives=hard_negatives(params, layout), query_forward=query_forward)
            if mix is not None:
                trainer.add_parameters(mix.parameters(), mlr.mix_learning_rate)
        if params.dev_every:
            score = DevScore(settings, data, save_encoder, layout.scratch)
            selection = train_selecting_on_dev(trainer, objective, params.dev_every, score,
                                               [encoder] if mix is None else [encoder, mix])
        else:
            trainer.train(objective, params.max_steps)
            selection = {}
        summary = {**trainer.summary(params.batch_size), **selection}
    if mix is not None:
        summary["scalar_mix_weights"] = mix.weights().tolist()
    step_log = pd.DataFrame(summary.pop("step_log"))
    if rank_and_world()[0] != 0:  # under torchrun only rank 0 writes the outputs
        return summary
    with atomic_path(layout.encoder) as out:
        save_encoder(out)
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
