"""HCE's settings (``train.hce``), part of ``params.yaml``'s typed view (``model_code/config.py``
reads them at load time, so this module imports pydantic only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class HCEParams(BaseModel):
    """Hierarchical Corpus Encoder training (HCE paper §4, Algorithm 3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, values: Any) -> Any:
        if isinstance(values, dict) and "dev_metric" in values:
            raise ValueError("train.hce.dev_metric moved to train.dev_metric (one dev metric for checkpoint "
                             "selection in both methods): move the setting there")
        return values

    mode: Literal["U", "S", "J", "CT"] = Field(
        "J", description="U (ICT pseudo-queries), S (train qrels), J (S + alpha*U, Eq. 7) or CT (J's data with the "
        "plain bidirectional in-batch loss: the paper's +CT baseline, no hierarchy terms)"
    )
    alpha: float = Field(0.5, ge=0, description="weight alpha of the unsupervised (ICT) loss in modes J and CT (Eq. 7)")
    levels_trained: int | Literal["auto"] = Field(
        "auto", description="M: tree levels trained with the sibling softmax over trainable centroids (initialised from "
        "the clustering, discarded at indexing); auto = every cluster level. Levels M+1..L use the contrastive loss "
        "with sampled negatives"
    )
    n_negatives: int = Field(4, ge=0, description="n_NS documents sampled from the positive's subtree per contrastive "
                             "level")
    negatives: Literal["cached", "encode"] = Field(
        "cached", description="cached: the negatives' embeddings from the last (re-)clustering, no gradient (cheap on "
        "CPU); encode: encoded afresh each step, with gradients"
    )
    hierarchy_weight: float = Field(1.0, ge=0, description="weight of the centroid-level (sibling softmax) sum in "
                                    "Eq. 6; 1.0 is the paper's plain sum (on SciFact, choose it on dev with benchmarks.sweep: "
                                    "docs/hce.md)")
    hierarchy_streams: list[Literal["supervised", "unsupervised"]] = Field(
        ["supervised", "unsupervised"],
        description="streams trained with the HCE loss; a stream left out keeps +CT's plain in-batch loss (the paper "
        "trains both; which is better on a corpus is a choice for benchmarks.sweep on dev)",
    )
    centroid_learning_rate: float | None = Field(
        None, gt=0, description="peak learning rate of the trainable centroids (levels 1..M), on the encoder's "
        "schedule; null = train.learning_rate (at ~1e-5 a unit-norm centroid barely moves in a few hundred steps)"
    )
    contrastive_weight: float = Field(1.0, ge=0, description="weight of the contrastive sum (levels M+1..L, in-batch "
                                      "plus sampled negatives) in Eq. 6; 1.0 is the paper's plain sum")
    rounds: int = Field(
        1, ge=1, description="EM rounds (Algorithm 3) sharing train.max_steps: after each, score dev and, when it "
        "improved, re-encode the corpus and rebuild the tree; at most train.max_steps (a round takes at least one "
        "step)"
    )
    patience: int = Field(1, ge=1, description="rounds without dev improvement before early stopping")
    dev_max_queries: int = Field(500, ge=1, description="dev queries scored after each round (a fixed subset)")
