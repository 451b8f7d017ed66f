"""Typed view of ``params.yaml``, the project's single source of configuration.

Every stage receives one of these pydantic models instead of a raw dict, so a typo in
``params.yaml`` fails loudly at load time (``extra="forbid"``) rather than being silently
ignored by a stage that never reads the misspelt key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DefaultCorpusParams(_Section):
    """The built-in corpus made from Python docstrings (see ``data/default_corpus.py``)."""

    max_documents: int = Field(3000, ge=100, description="documents kept, chosen deterministically")
    min_summary_words: int = Field(4, ge=1, description="shortest summary line accepted as a query")
    min_body_words: int = Field(12, ge=1, description="shortest docstring body accepted as a document")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of queries in the test split")
    packages: list[str] = Field(
        default_factory=lambda: ["numpy", "pandas", "scipy"],
        description="installed packages read besides the standard library (project dependencies)",
    )


class DataParams(_Section):
    """Corpus ingestion: where the data comes from and how it is split."""

    source: Literal["default", "beir", "parquet", "hf"] = "default"
    path: str | None = Field(None, description="BEIR directory, parquet directory or HF dataset path")
    default_corpus: DefaultCorpusParams = DefaultCorpusParams()
    dev_fraction: float = Field(0.1, ge=0, lt=1, description="train queries moved to dev when none given")
    split_fractions: dict[str, float] = Field(
        default_factory=lambda: {"old": 0.90, "new": 0.09, "tune": 0.01},
        description="IncDSI document split (old/new/tune), fractions of the corpus",
    )
    max_duplicate_text_rate: float = Field(0.05, ge=0, le=1, description="GX: allowed duplicate-text share")
    min_text_chars: int = Field(1, ge=1, description="GX: shortest document text")
    max_text_chars: int = Field(100_000, ge=1, description="GX: longest document text")
    include_incoming: bool = Field(
        False, description="append every accepted inbox batch to the source corpus (set by full retrains)"
    )
    seed: int = 13

    @model_validator(mode="after")
    def _check(self) -> DataParams:
        if self.source != "default" and not self.path:
            raise ValueError(f"data.path is required when data.source is {self.source!r}")
        if set(self.split_fractions) != {"old", "new", "tune"}:
            raise ValueError("data.split_fractions needs exactly the keys old, new, tune")
        if abs(sum(self.split_fractions.values()) - 1.0) > 1e-6:
            raise ValueError("data.split_fractions must sum to 1")
        return self


class GeneratorParams(_Section):
    """doc2query-style seq2seq query generation (IncDSI App. A) for the document-id head."""

    model: str | None = Field(None, description="local seq2seq model path; null = extractive fallback")
    queries_per_document: int = Field(15, ge=1)
    top_k: int = Field(10, ge=1, description="top-k sampling")
    max_length: int = Field(32, ge=4, description="generated query length, tokens")
    max_input_length: int = Field(256, ge=8)
    batch_size: int = Field(16, ge=1)
    seed: int = 29


class QuerygenParams(_Section):
    """Pseudo-queries for unsupervised training (ICT spans) and generated queries per document."""

    method: Literal["ict"] = "ict"
    span_tokens: int = Field(64, ge=1, description="length of each contiguous span, in words")
    per_document: int = Field(1, ge=1, description="pseudo-queries per document")
    seed: int = 17
    generator: GeneratorParams = GeneratorParams()


class HierarchyParams(_Section):
    """Corpus tree built by recursive spherical k-means."""

    builder: Literal["agglomerative", "divisive"] = Field(
        "agglomerative", description="bottom-up equal-depth tree (HCE Alg. 1) or top-down (scalable)"
    )
    branching: int | Literal["auto"] = Field(
        "auto", description="children per node (b); auto = smallest power of two giving depth <= 3"
    )
    niter: int = Field(20, ge=1, description="k-means iterations per split")
    seed: int = 19


    @model_validator(mode="after")
    def _check(self) -> HierarchyParams:
        if isinstance(self.branching, int) and self.branching < 2:
            raise ValueError("hierarchy.branching must be >= 2 or 'auto'")
        return self

    def branching_for(self, n_documents: int) -> int:
        from model_code.hierarchy.tree import auto_branching

        return auto_branching(n_documents) if self.branching == "auto" else self.branching


class EncoderParams(_Section):
    """Which encoder to load and how it embeds text."""

    model: str = Field("minilm", description="'minilm' (bundled all-MiniLM-L6-v2) or a local HF model path")
    pooling: Literal["mean", "cls"] = "mean"
    max_query_length: int = 64
    max_passage_length: int = 256
    batch_size: int = 64


class HCEParams(_Section):
    """Hierarchical Corpus Encoder training (HCE paper §4, Algorithm 3)."""

    mode: Literal["U", "S", "J", "CT"] = Field(
        "J", description="U: ICT pseudo-queries; S: train qrels; J: S + alpha*U; CT: J without hierarchy terms"
    )
    alpha: float = Field(0.5, ge=0, description="weight of the unsupervised loss in J/CT (Eq. 7)")
    levels_trained: int | Literal["auto"] = Field(
        "auto", description="M: centroid levels trained with the sibling softmax; auto = all cluster levels"
    )
    n_negatives: int = Field(4, ge=0, description="n_NS documents sampled per contrastive level")
    negatives: Literal["cached", "encode"] = Field(
        "cached", description="sampled negatives from embeddings cached at the last re-clustering, or re-encoded"
    )
    hierarchy_weight: float = Field(1.0, ge=0)
    hierarchy_streams: list[Literal["supervised", "unsupervised"]] = Field(
        ["supervised", "unsupervised"],
        description="streams trained with the HCE loss; the others keep the plain in-batch loss of +CT",
    )
    centroid_learning_rate: float | None = Field(
        None, gt=0, description="peak rate of the trainable centroids (same schedule); null = train.learning_rate"
    )
    contrastive_weight: float = Field(1.0, ge=0)
    rounds: int = Field(
        1, ge=1, description="EM rounds sharing train.max_steps: train, score dev, re-cluster when dev improves"
    )
    patience: int = Field(1, ge=1, description="rounds without dev improvement before stopping")
    dev_metric: str = "ndcg@10"
    dev_max_queries: int = Field(500, ge=1, description="dev queries scored after each round (a fixed subset)")


class TrainParams(_Section):
    """Fine-tuning of the encoder: plain contrastive, or HCE."""

    enabled: bool = Field(True, description="false = keep the loaded encoder as is (zero-shot)")
    method: Literal["contrastive", "hce"] = "contrastive"
    hce: HCEParams = HCEParams()
    optimizer: Literal["adamw", "adafactor"] = "adamw"
    grad_accumulation: int = Field(1, ge=1, description="micro-batches per optimiser step")
    data: Literal["supervised", "unsupervised", "joint"] = "supervised"
    temperature: float = Field(0.05, gt=0)
    batch_size: int = Field(32, ge=2)
    learning_rate: float = Field(2e-5, gt=0)
    weight_decay: float = 0.01
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_steps: int = Field(40, ge=1, description="optimisation steps (the training budget)")
    max_passage_length: int = Field(128, ge=8, description="passage length during training (speed)")
    grad_clip: float = 1.0
    seed: int = 23


class IndexParams(_Section):
    """FAISS index over L2-normalised document vectors (inner product = cosine)."""

    factory: str = Field("Flat", description="faiss index_factory string, e.g. Flat, IVF64,Flat, HNSW32")
    nprobe: int = Field(8, ge=1, description="IVF cells probed at search time")
    use_gpu: Literal["auto", "never"] = "auto"


class EvalParams(_Section):
    """Retrieval evaluation of the test split."""

    split: Literal["test", "dev", "train"] = "test"
    top_k: int = Field(100, ge=10)
    metrics: list[str] = Field(
        default_factory=lambda: ["ndcg@10", "recall@1", "recall@5", "recall@10", "recall@100", "mrr@10"]
    )


class RegistryParams(_Section):
    """MLflow experiment, registered model and the promotion rule."""

    experiment: str = "fresh-retriever"
    model_name: str = "fresh-retriever"
    metric: str = Field("ndcg@10", description="metric compared against the current champion")
    min_improvement: float = Field(0.0, ge=0, description="margin a challenger must beat the champion by")


class IncDSIParams(_Section):
    """IncDSI document-id head and the addition of new documents to it."""

    head_documents: Literal["all", "old"] = Field(
        "all", description="documents the built head covers: all (a deployable head) or old (the IncDSI evaluation "
        "protocol, which then adds the new documents)")
    head_epochs: int = Field(20, ge=0, description="CE fine-tuning epochs of the head (encoder frozen)")
    head_learning_rate: float = Field(1e-3, gt=0)
    tune_trials: int = Field(50, ge=0, description="optuna trials choosing lambda1, gamma1, gamma2, lambda2, init when the "
                             "head is built (IncDSI: 50; 0 = use the values below)")
    tune_share: float = Field(0.1, gt=0, lt=1, description="share of the head simulated as additions while tuning")
    tune_beta: float = Field(5.0, gt=0, description="F_beta of old/new MRR@10 maximised by the tuning (> 1 favours "
                             "the old documents; IncDSI uses 5)")
    tune_objective: Literal["fbeta", "constrained"] = Field(
        "fbeta", description="fbeta: F_beta of old/new MRR@10 (IncDSI); constrained: the best new-document MRR@10 "
        "whose simulated old-document MRR@10 drop is at most tune_max_old_drop")
    tune_max_old_drop: float = Field(0.01, ge=0, description="allowed absolute old-document MRR@10 drop (constrained)")
    lambda1: float = Field(0.5, gt=0, lt=1, description="weight of l1 (new doc wins) vs l2 (old docs kept)")
    gamma1: float = Field(1.0, ge=0, description="margin of the new document over the best existing row")
    gamma2: float = Field(1.0, ge=0, description="margin kept by every existing document's own logit")
    lambda2: float = Field(1e-6, ge=0, description="L2 regularisation of the new row")
    init: Literal["random", "document"] = Field(
        "random", description="where the new row starts: random (reference code) or the document's embedding")
    max_steps: int = Field(30, ge=1, description="outer L-BFGS steps")
    tolerance: float = Field(1e-3, gt=0, description="stop when the row moves less than this")
    seed: int = 123


class DriftThresholds(_Section):
    """When a batch is applied incrementally and when it triggers a full retrain (any one trips).
    Defaults are justified by measurements in README.md ("Drift thresholds")."""

    max_volume_ratio: float = Field(
        0.25, gt=0, description="documents added since the last full training / documents trained on"
    )
    max_similarity_ks: float = Field(
        0.5, gt=0, le=1, description="KS statistic: new vs training documents' cosine to the nearest top centroid"
    )
    max_cluster_psi: float = Field(
        0.75, gt=0, description="population-stability index of top-level cluster assignments, new vs training"
    )
    max_canary_mrr_drop: float = Field(
        0.01, ge=0, description="absolute MRR@10 drop of the canary queries after the additions"
    )
    max_unseparable_share: float = Field(
        0.2, ge=0, le=1, description="share of IncDSI additions whose constraints could not all be met"
    )


class FreshnessParams(_Section):
    """The freshness loop: inbox of incoming document batches, drift report, sensor decisions."""

    retriever: Literal["dense", "incdsi"] = Field(
        "dense", description="the deployed retriever: evaluated, registered, served and updated (dense FAISS index, "
        "or the IncDSI document-id head)")
    canary_queries: int = Field(200, ge=1, description="fixed sample of old documents' test queries")
    min_batch_documents: int = Field(20, ge=1, description="batches smaller than this use only the cumulative KS")
    thresholds: DriftThresholds = DriftThresholds()
    seed: int = 31


class Params(_Section):
    data: DataParams = DataParams()
    querygen: QuerygenParams = QuerygenParams()
    hierarchy: HierarchyParams = HierarchyParams()
    encoder: EncoderParams = EncoderParams()
    train: TrainParams = TrainParams()
    index: IndexParams = IndexParams()
    eval: EvalParams = EvalParams()
    registry: RegistryParams = RegistryParams()
    incdsi: IncDSIParams = IncDSIParams()
    freshness: FreshnessParams = FreshnessParams()


def load_params(path: str | Path, overrides: dict[str, Any] | None = None) -> Params:
    """Read ``params.yaml`` and apply nested ``overrides`` (e.g. from a Dagster run config)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"params file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    merged = deep_merge(raw, overrides or {})
    try:
        return Params.model_validate(merged)
    except ValueError as exc:
        raise ValueError(f"{path}: invalid parameters:\n{exc}") from None


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``update`` merged in, recursing into nested mappings."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def flatten(params: BaseModel | dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested params to ``section.key`` pairs (for MLflow run params)."""
    data = params.model_dump() if isinstance(params, BaseModel) else params
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def params_hash(section: BaseModel) -> str:
    """Stable short hash of a params section (used as Dagster code version)."""
    blob = json.dumps(section.model_dump(), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
