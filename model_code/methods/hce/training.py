"""HCE training with EM-style co-training of encoder and corpus tree (HCE Algorithm 3).

    T <- cluster(F0(D));  m <- dev(F0)
    for each round:
        F' <- optimise(F, T)            # HCE loss against the current tree
        m' <- dev(F')                   # re-encodes the corpus
        if m' > m: T <- cluster(F'(D)); m <- m'   (E-step; centroids re-initialised)
        F <- F'
    stop early after ``patience`` rounds without improvement

The encoder returned is the best on dev (model selection on dev, never test), and the tree
returned is the one clustered from it (the EM history is in the summary's ``rounds``). Modes: U (ICT pseudo-queries), S (train qrels),
J (S + alpha*U), CT (J's data with the plain bidirectional loss: the "+CT" baseline).
"""

from __future__ import annotations

import copy
import functools
import logging

import numpy as np
import pandas as pd
import torch

from model_code.config import EncoderParams, HierarchyParams, Params, TrainParams
from model_code.data.ingested import IngestedData
from model_code.eval.dev import DevScorer
from model_code.hierarchy.tree import CorpusTree, build_tree
from model_code.layout import Layout
from model_code.methods.hce.loss import HCELoss
from model_code.methods.hce.objective import HCEObjective
from model_code.models.encoder import Encoder
from model_code.training.distributed import from_rank0, rank_and_world
from model_code.training.loop import StepCallback, Trainer, seed_everything
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import ContrastiveObjective, Stream
from model_code.training.pairs import batches, pseudo_pairs, supervised_pairs

log = logging.getLogger(__name__)


def hce_streams(params: TrainParams, data: IngestedData, pseudo_queries: pd.DataFrame | None) -> list[Stream]:
    mode, seed = params.hce.mode, params.seed
    streams = []
    if mode in ("S", "J", "CT"):
        streams.append(Stream("supervised", batches(supervised_pairs(data), params.batch_size, seed), 1.0))
    if mode in ("U", "J", "CT"):
        if pseudo_queries is None:
            raise ValueError(f"HCE mode {mode} needs the pseudo-queries of the querygen stage")
        weight = 1.0 if mode == "U" else params.hce.alpha
        streams.append(Stream("unsupervised", batches(pseudo_pairs(pseudo_queries), params.batch_size, seed + 1), weight))
    for stream in streams:
        stream.hierarchical = stream.name in params.hce.hierarchy_streams
    if mode != "CT" and not any(stream.hierarchical for stream in streams):
        raise ValueError(f"train.hce.hierarchy_streams {params.hce.hierarchy_streams} names none of mode {mode}'s streams: "
                         "that trains without the tree, which is mode CT")
    return streams


def train_hce(
    encoder: Encoder,
    tree: CorpusTree,
    embeddings: np.ndarray,
    data: IngestedData,
    pseudo_queries: pd.DataFrame | None,
    params: TrainParams,
    hierarchy: HierarchyParams,
    encoder_params: EncoderParams,
    on_step: StepCallback | None = None,
    scorer: DevScorer | None = None,
    ignore_identical_ids: bool = True,
    hard_negatives: HardNegatives | None = None,
    top_k: int = 0,
) -> tuple[dict, CorpusTree]:
    """Train ``encoder`` in place (best dev state restored); return (summary, final tree).
    ``hard_negatives``: mined negatives, candidates of every stream's queries besides the tree's.

    ``scorer`` defaults to a ``DevScorer`` on the dev split (none: no EM, the last state is kept),
    scoring as the evaluation does (``eval.ignore_identical_ids``, ``eval.top_k``: ``top_k``)."""
    seed_everything(params.seed)
    hce = params.hce
    passages = data.passages()
    doc_ids = data.corpus["doc_id"].tolist()
    if tree.doc_ids != doc_ids:
        raise ValueError("the corpus tree was built for another corpus: re-run the cluster stage")
    streams = hce_streams(params, data, pseudo_queries)
    steps_per_round = max(1, params.max_steps // hce.rounds)
    trainer = Trainer(encoder, params, steps_per_round * hce.rounds, on_step)
    if scorer is None and "dev" in data.qrels:
        scorer = DevScorer(data, params.dev_metric, max_queries=hce.dev_max_queries,
                           ignore_identical_ids=ignore_identical_ids, top_k=top_k)
    # the cluster stage's embeddings score the starting encoder only if encoded at the dev length
    reusable = embeddings if encoder_params.max_passage_length == params.max_passage_length else None
    def dev_score(embeddings: np.ndarray | None = None) -> tuple[float, np.ndarray]:  # at the dev length
        return scorer.score_encoder(encoder, encoder_params, params.max_passage_length, embeddings)

    best_score = from_rank0(dev_score(reusable)[0]) if scorer else float("-inf")
    best_state = copy.deepcopy(encoder.state_dict()) if scorer else None
    rounds, stale = [{"round": 0, "dev": best_score, "reclustered": True}], 0
    sampler = torch.Generator().manual_seed(params.seed)
    query_forward = functools.partial(encoder, side="query")  # the query side (a tied encoder's only one)

    def objective_for(current: CorpusTree, cache: np.ndarray):
        if hce.mode == "CT":
            return ContrastiveObjective(encoder, streams, dict(zip(doc_ids, passages)).__getitem__, params.temperature,
                                        encoder_params.max_query_length, params.max_passage_length,
                                        hard_negatives=hard_negatives, query_forward=query_forward)
        levels = current.depth if hce.levels_trained == "auto" else hce.levels_trained
        loss = HCELoss(current, levels, params.temperature, hce.n_negatives, hce.hierarchy_weight, hce.contrastive_weight)
        loss.to(encoder.device)
        trainer.add_parameters(loss.parameters(), hce.centroid_learning_rate)
        return HCEObjective(encoder, loss, streams, doc_ids, passages, torch.as_tensor(cache),
                            hce.negatives == "encode", encoder_params.max_query_length,
                            params.max_passage_length, sampler, hard_negatives=hard_negatives,
                            query_forward=query_forward)

    objective = objective_for(tree, embeddings)
    for round_no in range(1, hce.rounds + 1):
        trainer.train(objective, steps_per_round, desc=f"HCE-{hce.mode} round {round_no}/{hce.rounds}")
        if scorer is None:  # no dev split: plain training against the initial tree
            continue
        score, fresh = dev_score()
        score = from_rank0(score)  # every rank takes rank 0's decisions (the negatives' cache stays per rank)
        event = {"round": round_no, "dev": score, "reclustered": score > best_score}
        if event["reclustered"]:  # a better representation: E-step, rebuild the tree from it
            best_score, best_state, stale = score, copy.deepcopy(encoder.state_dict()), 0
            if encoder_params.max_passage_length != params.max_passage_length:  # the dev scorer's length:
                # every tree (and negatives' cache) is built from embeddings at the indexing length
                fresh = encoder.encode(passages, encoder_params.max_passage_length, encoder_params.batch_size,
                                       desc="encoding corpus (tree)")
            tree = from_rank0(build_tree(doc_ids, fresh, hierarchy.branching_for(len(doc_ids)), hierarchy.niter,
                                         hierarchy.seed, hierarchy.builder) if rank_and_world()[0] == 0 else None)
            if round_no < hce.rounds:
                objective = objective_for(tree, fresh)
        else:
            stale += 1
        rounds.append(event)
        log.info("round %d: dev %s %.4f (best %.4f)%s", round_no, params.dev_metric, score, best_score,
                 ", re-clustered" if event["reclustered"] else "")
        if stale >= hce.patience:
            log.info("early stopping: %d round(s) without dev improvement", stale)
            break
    if scorer is not None:
        encoder.load_state_dict(best_state)
    summary = {**trainer.summary(params.batch_size * len(streams)), "dev_best": best_score, "rounds": rounds}
    return summary, tree


def train(settings: Params, layout: Layout, encoder: Encoder, tree: CorpusTree | None, data: IngestedData,
          pseudo_queries: pd.DataFrame | None, hard_negatives: HardNegatives | None,
          on_step: StepCallback | None = None) -> tuple[dict, CorpusTree]:
    """The train stage's ``train.method: hce``: ``train_hce`` against the cluster stage's ``tree`` and
    the embeddings it was built from."""
    if tree is None:
        raise FileNotFoundError(f"{layout.hierarchy / 'tree.npz'}: HCE training needs the corpus tree; run the "
                                "cluster stage first")
    embeddings = np.load(layout.hierarchy / "embeddings.npy")
    return train_hce(encoder, tree, embeddings, data, pseudo_queries, settings.train, settings.hierarchy,
                     settings.encoder, on_step, ignore_identical_ids=settings.eval.ignore_identical_ids,
                     hard_negatives=hard_negatives, top_k=settings.eval.top_k)
