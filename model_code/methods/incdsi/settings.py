"""IncDSI's settings (``retriever.incdsi``), validated through the kind registry like every kind's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class IncDSIParams(BaseModel):
    """IncDSI document-id head and the addition of new documents to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    head_documents: Literal["all", "old"] = Field(
        "all", description="documents the built head covers: all (a deployable head) or old (the IncDSI evaluation "
        "protocol, which then adds the new documents)")
    head_epochs: int = Field(20, ge=0, description="CE fine-tuning epochs of the head (encoder frozen)")
    head_learning_rate: float = Field(1e-3, gt=0, description="learning rate of the head's CE fine-tuning")
    tune_trials: int = Field(50, ge=0, description="optuna trials choosing lambda1, gamma1, gamma2, lambda2, init when the "
                             "head is built (IncDSI: 50; 0 = use the values below)")
    tune_share: float = Field(0.1, gt=0, lt=1, description="share of the head simulated as additions while tuning")
    tune_beta: float = Field(5.0, gt=0, description="F_beta of old/new MRR@10 maximised by the tuning (> 1 favours "
                             "the old documents; IncDSI uses 5)")
    tune_objective: Literal["fbeta", "constrained"] = Field(
        "fbeta", description="fbeta: F_beta of old/new MRR@10 (IncDSI); constrained: the best new-document MRR@10 "
        "whose simulated old-document MRR@10 drop is at most tune_max_old_drop")
    tune_max_old_drop: float = Field(0.01, ge=0, description="allowed absolute old-document MRR@10 drop (constrained)")
    lambda1: float = Field(0.5, gt=0, lt=1, description="weight of l1 (the new document beats every row on its mean "
                           "query) vs l2 (no existing document's representative query is taken)")
    gamma1: float = Field(1.0, ge=0, description="margin of l1: the new document over the best existing row")
    gamma2: float = Field(1.0, ge=0, description="margin of l2: kept by every existing document's own logit")
    lambda2: float = Field(1e-6, ge=0, description="L2 regularisation of the new row")
    init: Literal["random", "document"] = Field(
        "random", description="where the new row's optimisation starts: random (the reference code's fresh row) or "
        "document (its own embedding, scaled to beat the best row by gamma1: more new-document hits, more "
        "old-document loss at equal margins)")
    max_steps: int = Field(30, ge=1, description="outer L-BFGS steps per addition")
    tolerance: float = Field(1e-3, gt=0, description="stop when the row moves less than this")
    seed: int = Field(123, description="seed of the head's fine-tuning, the tuning trials and random row "
                      "initialisation")
    constraint_candidates: int | None = Field(
        None, ge=1, description="C: an addition considers only the C representative queries nearest its mean query and "
        "the C rows scoring highest on it, found by an approximate (FAISS IVF) search, instead of every row (null: "
        "the exact problem, O(n d) per optimiser evaluation). Read, like the values above, into the head's "
        "addition.json when the head is built")
