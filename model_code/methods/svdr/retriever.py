"""Kind ``svdr``: semi-parametric retrieval over the vocabulary (SVDR, *Semi-Parametric Retrieval
via Binary Token Index*; docs/svdr.md).

Queries and documents live in the tokenizer's vocabulary space: a parametric vector E(x) from the
sparse encoder (``methods/svdr/model.py``) or the binary bag of tokens T(x) from the tokenizer
alone. ``retriever.svdr.search`` picks what is indexed and how a query is scored:

* ``full``:  E(q) · E(d), over an index of the encoder's document vectors;
* ``alpha``: T(q) · E(d), the same index, no query encoder at search time;
* ``beta``:  E(q) · T(d), over the binary token index: indexing and adding documents need only
  the tokenizer (no neural pass, the method's point for freshness);
* ``beta_rerank``: beta for the top ``rerank_depth`` (m), those m passages embedded on the fly
  and re-scored by E(q) · E(d); hits past m keep their beta order, their scores shifted below the
  re-scored ones so that whatever sorts by score sees the same ranking.

E(q) keeps the top ``topk`` dimensions OR-ed with the query's own tokens, as do the re-ranked
passages; the document index of ``full`` / ``alpha`` keeps the pure top-k (as the reference's
``encode_corpus``). The binary index is cut at ``encoder.max_passage_length`` tokens like the
encoder. Both indexes are the sparse store of ``index.backend`` (``stores.csr_store`` by default, or
a Milvus collection): searched by id, so any sparse store serves, and ``beta_rerank`` keeps its
passages by document id. Additions append rows, removals mask them, and an incremental version
stores only those rows (``save_delta``). There is no single dense vector per document, so drift statistics see none
(``vector_view`` is None) and the freshness loop decides on document volume alone.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
import scipy.sparse as sp
from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers import AutoConfig, AutoTokenizer

from model_code.config import EncoderParams, Params
from model_code.data.ingested import IngestedData, passage_texts
from model_code.layout import Layout
from model_code.methods.svdr.model import BERT_VOCAB_START, SparseEncoder
from model_code.methods.svdr.token_bags import bag_of_tokens
from model_code.retrievers.base import Retriever, SearchHit, UpdateContext
from model_code.retrievers.registry import register
from model_code.stores import VectorStore, load_store, store_class

if TYPE_CHECKING:
    from model_code.training.recipe import TrainingRecipe

PARAMETRIC_INDEX = ("full", "alpha")  # modes whose index holds the encoder's document vectors
RECORDED = ("max_query_length", "max_passage_length", "batch_size")


class SVDRSettings(BaseModel):
    """Kind svdr: sparse vocabulary encoder and binary token index (SVDR)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    search: Literal["full", "alpha", "beta", "beta_rerank"] = Field(
        "beta", description="full: encoded query x encoded documents; alpha: query tokens x encoded documents; "
        "beta: encoded query x binary token index (no document encoder); beta_rerank: beta, then the top "
        "rerank_depth passages encoded and re-scored")
    rerank_depth: int = Field(100, ge=1, description="beta_rerank: passages re-scored per query (m; the paper "
                              "reports 10 and 100)")
    topk: int | None = Field(768, ge=0, description="dimensions an encoded text keeps (the paper's 768), besides "
                             "its own tokens where SVDR adds them; null keeps all")
    vocab_start: int = Field(BERT_VOCAB_START, ge=0, description="first vocabulary id used as a dimension "
                             "(999 drops BERT's [PAD], [unused*] and special tokens, as the reference)")
    shared_encoder: bool = Field(True, description="one encoder for queries and passages; false: a separate "
                                 "passage encoder (the reference's fine-tuned setting)")
    loss: Literal["svdr", "vdr"] = Field("svdr", description="what the train stage optimises: svdr, the "
                                         "semi-parametric loss (4 terms); vdr, its parametric-query half (2 terms)")
    retrieved_negatives: int = Field(0, ge=0, description="train stage: negatives per query retrieved each step "
                                     "from the corpus's binary token index with the current query encoder (beta), "
                                     "relevant documents left out, added to the loss as hard negatives; 0 = off "
                                     "(the reference's ret_negatives, 0 in all its configs)")
    retrieval_depth: int = Field(20, ge=1, description="train stage, retrieved_negatives > 0: the best non-relevant "
                                 "beta hits per query the negatives are drawn from (the reference's ret_topk)")

    @model_validator(mode="after")
    def _draws_fit_the_pool(self) -> SVDRSettings:
        if self.retrieved_negatives > self.retrieval_depth:
            raise ValueError(f"retriever.svdr.retrieved_negatives ({self.retrieved_negatives}) are drawn from the "
                             f"top retrieval_depth ({self.retrieval_depth}) hits: raise retrieval_depth or draw fewer")
        return self


class SparseEncoderHandle:
    """The encoder directory with the lengths the index was built with; the tokenizer and the
    model load on first use, so a beta addition never loads the model."""

    def __init__(self, directory: Path, settings: SVDRSettings, lengths: dict[str, Any]):
        self.directory, self.settings = Path(directory), settings
        self.lengths = {key: lengths[key] for key in RECORDED}

    @classmethod
    def from_params(cls, directory: Path, settings: SVDRSettings, params: EncoderParams) -> SparseEncoderHandle:
        return cls(directory, settings, params.model_dump())

    @functools.cached_property
    def model(self) -> SparseEncoder:
        return SparseEncoder(str(self.directory), self.settings.vocab_start, self.settings.shared_encoder)

    @functools.cached_property
    def tokenizer(self):
        return AutoTokenizer.from_pretrained(self.directory, local_files_only=True)

    @functools.cached_property
    def vocab_size(self) -> int:
        return AutoConfig.from_pretrained(self.directory, local_files_only=True).vocab_size - self.settings.vocab_start

    def tokens(self, texts: list[str], side: str, desc: str | None = None) -> sp.csr_matrix:
        return bag_of_tokens(self.tokenizer, texts, self.lengths[f"max_{side}_length"], self.settings.vocab_start,
                             self.vocab_size, desc=desc)

    def embed(self, texts: list[str], side: str, lexical: bool, desc: str | None = None) -> sp.csr_matrix:
        return self.model.encode(texts, side, self.lengths[f"max_{side}_length"], self.settings.topk, lexical,
                                 self.lengths["batch_size"], desc=desc)

    def index_rows(self, texts: list[str], desc: str | None = None) -> sp.csr_matrix:
        """What the index holds for ``texts``: encoded documents (full, alpha) or their tokens."""
        if self.settings.search in PARAMETRIC_INDEX:
            return self.embed(texts, "passage", lexical=False, desc=desc)
        return self.tokens(texts, "passage", desc=desc)


@register
class SVDRRetriever(Retriever):
    kind = "svdr"
    index_shape = "sparse"  # token bags and sparse embeddings (CSR rows)
    settings_model = SVDRSettings
    uses_tree = False  # SVDR trains contrastively and indexes without a corpus tree: the cluster stage skips

    @classmethod
    def corpus_encoding(cls, params: Params, layout: Layout) -> None:
        """None: the binary token index needs only the tokenizer, and the sparse encoder's vectors
        are not in the embedding cache (it holds dense vectors)."""

    def __init__(self, index: VectorStore, encoder: SparseEncoderHandle, passages: dict[str, str] | None = None,
                 info: dict[str, Any] | None = None):
        self.index, self.encoder, self.settings = index, encoder, encoder.settings
        self.passages = passages  # beta_rerank: each document's text by id, embedded when it is a candidate
        self._added: dict[str, str] = {}  # passages added since load or build, as the index's own journal: the delta's
        self.info = info or {}

    @classmethod
    def training_recipe(cls) -> type[TrainingRecipe]:
        from model_code.methods.svdr.training import (
            SVDRRecipe,  # training code stays out of what searching imports
        )

        return SVDRRecipe

    @classmethod
    def build(cls, params: Params, data: IngestedData, layout: Layout) -> SVDRRetriever:
        settings = params.retriever.settings(cls.kind)
        encoder = SparseEncoderHandle.from_params(layout.encoder, settings, params.encoder)
        texts = data.passages()
        start = time.perf_counter()
        matrix = encoder.index_rows(texts, desc="indexing corpus")
        seconds = time.perf_counter() - start
        index = store_class(params.index.backend, "sparse").build(matrix, data.corpus["doc_id"].tolist(), params.index)
        passages = dict(zip(data.corpus["doc_id"], texts)) if settings.search == "beta_rerank" else None
        return cls(index, encoder, passages, {
            "index_seconds": seconds, "documents_per_second": len(texts) / max(seconds, 1e-9),
            "nonzeros_per_document": matrix.nnz / max(len(texts), 1)})

    def save_files(self, directory: Path) -> dict[str, Any]:
        self.index.save(directory / "index")
        if self.passages is not None:
            _write_passages({d: self.passages[d] for d in self.index.live_ids()}, directory / "passages.parquet")
        return {**self.info, "svdr": self.settings.model_dump(), "encoder": self.encoder.lengths}

    @classmethod
    def load_files(cls, directory: Path, manifest: dict[str, Any], encoder_dir: Path | None) -> SVDRRetriever:
        settings = SVDRSettings.model_validate(manifest["svdr"])
        index, passages = load_store(directory / "index"), directory / "passages.parquet"
        return cls(index, SparseEncoderHandle(encoder_dir, settings, manifest["encoder"]),
                   _read_passages(passages, lambda: index.doc_ids) if passages.is_file() else None,
                   {k: manifest[k] for k in ("index_seconds", "documents_per_second", "nonzeros_per_document")
                    if k in manifest})

    def search(self, queries: list[str], k: int, desc: str | None = None) -> list[SearchHit]:
        mode = self.settings.search
        if mode == "alpha":
            encoded = self.encoder.tokens(queries, "query")
        else:
            encoded = self.encoder.embed(queries, "query", lexical=True, desc=desc)
        depth = max(k, self.settings.rerank_depth) if mode == "beta_rerank" else k
        scores, ids = self.index.search(encoded, depth)
        hits = [SearchHit(i, s[: len(i)].tolist()) for s, i in zip(scores, ids)]
        if mode == "beta_rerank":
            hits = self._rerank(encoded, hits)
        return [SearchHit(h.doc_ids[:k], h.scores[:k]) for h in hits]

    def _rerank(self, queries: sp.csr_matrix, hits: list[SearchHit]) -> list[SearchHit]:
        """Re-score each query's first m beta hits by E(q) · E(d), each distinct candidate
        embedded once for the whole query list; later hits keep their beta order below them."""
        m = self.settings.rerank_depth
        candidates = sorted({d for hit in hits for d in hit.doc_ids[:m]})
        embedded = self.encoder.embed([self.passages[d] for d in candidates], "passage", lexical=True)
        position = {d: i for i, d in enumerate(candidates)}
        reranked = []
        for query, hit in zip(queries, hits):
            top = hit.doc_ids[:m]
            head = (query @ embedded[[position[d] for d in top]].T).toarray().ravel().astype(np.float64)
            order = np.argsort(-head, kind="stable")
            tail = np.asarray(hit.scores[len(top):], dtype=np.float64)
            if len(tail):
                tail = tail - tail[0] + head[order[-1]] - 1.0
            reranked.append(SearchHit([top[i] for i in order] + hit.doc_ids[len(top):],
                                      head[order].tolist() + tail.tolist()))
        return reranked

    def live_ids(self) -> list[str]:
        return self.index.live_ids()

    def add(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        """Append the documents' rows: for beta and beta_rerank their bags of tokens (the
        tokenizer only, no model is loaded), for full and alpha their encoded vectors."""
        start = time.perf_counter()
        texts = passage_texts(documents)
        self.index.add(self.encoder.index_rows(texts), documents["doc_id"].tolist())
        if self.passages is not None:
            added = dict(zip(documents["doc_id"], texts))
            self.passages.update(added)
            self._added.update(added)
        return {"add_ms_per_doc": 1000 * (time.perf_counter() - start) / max(len(documents), 1)}

    def remove(self, doc_ids: list[str]) -> int:
        return self.index.remove(doc_ids)  # a removed document's text stays (never a candidate) until a whole save

    def save_delta(self, directory: Path) -> dict[str, Any]:
        self.index.save_delta(directory / "index_delta")
        if self.passages is not None:
            _write_passages(self._added, directory / "passages_delta.parquet")
        return {}

    def apply_delta(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.index.apply_delta(directory / "index_delta")
        if self.passages is not None:
            self.passages.update(_read_passages(directory / "passages_delta.parquet",
                                                lambda: load_store(directory / "index_delta").doc_ids))


def _write_passages(passages: dict[str, str], path: Path) -> None:
    pd.DataFrame({"doc_id": list(passages), "passage": list(passages.values())}).to_parquet(path, index=False)


def _read_passages(path: Path, row_ids) -> dict[str, str]:
    """The passages saved at ``path`` by id. Versions saved before passages had ids hold one per
    index row, in row order: ``row_ids()`` gives those rows' ids (a later row of an id, a document
    added again, is its live one)."""
    frame = pd.read_parquet(path)
    ids = frame["doc_id"].tolist() if "doc_id" in frame else list(row_ids())
    return dict(zip(ids, frame["passage"]))

