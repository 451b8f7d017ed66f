"""Kind ``bm25``: the lexical baseline (bm25s, Lucene's BM25 by default, English stemming and
stopwords), deployable like any other kind. It has no encoder and nothing to train.

bm25s keeps a compressed sparse index with no incremental update, so ``add`` / ``remove``
re-index the kept document texts: linear in the corpus (about a second for SciFact's 5k
documents on one CPU core), still far below a retrain.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import bm25s
import pandas as pd
import Stemmer
from pydantic import BaseModel, ConfigDict, Field

from model_code.config import Params
from model_code.data.ingested import IngestedData, passage_texts
from model_code.layout import Layout
from model_code.retrievers.base import Retriever, SearchHit, UpdateContext
from model_code.retrievers.registry import register


class BM25Params(BaseModel):
    """Lexical BM25 (bm25s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = Field(
        "lucene", description="BM25 variant (the bm25s scoring method; lucene is Lucene's BM25)")
    k1: float = Field(1.5, gt=0, description="term-frequency saturation: higher lets repeated terms count for more")
    b: float = Field(0.75, ge=0, le=1, description="document-length normalisation: 0 = none, 1 = full")
    stemmer: str | None = Field("english", description="PyStemmer language for query and document terms; null = none")
    stopwords: str | None = Field("en", description="bm25s stopword list removed before indexing; null = keep all")


@register
class BM25Retriever(Retriever):
    kind = "bm25"
    settings_model = BM25Params
    uses_encoder = False
    index_shape = None  # bm25s keeps its own index files, whatever index.backend says

    def __init__(self, documents: pd.DataFrame, settings: BM25Params):
        self.documents = documents[["doc_id", "title", "text"]].reset_index(drop=True)
        self.settings = settings
        self.stemmer = Stemmer.Stemmer(settings.stemmer) if settings.stemmer else None
        self._index()

    def _tokenize(self, texts: list[str]):
        return bm25s.tokenize(texts, stopwords=self.settings.stopwords or [], stemmer=self.stemmer, show_progress=False)

    def _index(self) -> None:
        self.model = bm25s.BM25(method=self.settings.method, k1=self.settings.k1, b=self.settings.b)
        if len(self.documents):
            self.model.index(self._tokenize(passage_texts(self.documents)), show_progress=False)

    @classmethod
    def build(cls, params: Params, data: IngestedData, layout: Layout) -> BM25Retriever:
        return cls(data.corpus, params.retriever.settings("bm25"))

    def save_files(self, directory: Path) -> dict[str, Any]:
        self.documents.to_parquet(directory / "documents.parquet", index=False)
        return {"bm25": self.settings.model_dump()}

    @classmethod
    def load_files(cls, directory: Path, manifest: dict[str, Any], encoder_dir: Path | None) -> BM25Retriever:
        return cls(pd.read_parquet(directory / "documents.parquet"), BM25Params(**manifest["bm25"]))

    def search(self, queries: list[str], k: int, desc: str | None = None) -> list[SearchHit]:
        k = min(k, len(self.documents))
        if not queries or not k:
            return [SearchHit([], []) for _ in queries]
        rows, scores = self.model.retrieve(self._tokenize(queries), k=k, show_progress=False)
        ids = self.documents["doc_id"].to_numpy()
        return [SearchHit(ids[row].tolist(), [float(s) for s in score]) for row, score in zip(rows, scores)]

    def live_ids(self) -> list[str]:
        return self.documents["doc_id"].tolist()

    def add(self, documents: pd.DataFrame, context: UpdateContext) -> dict[str, Any]:
        start = time.perf_counter()
        self.documents = pd.concat([self.documents, documents[["doc_id", "title", "text"]]], ignore_index=True)
        self._index()
        return {"reindex_ms": 1000 * (time.perf_counter() - start)}

    def remove(self, doc_ids: list[str]) -> int:
        missing = set(doc_ids) - set(self.documents["doc_id"])
        if missing:
            raise KeyError(f"documents not in the index: {sorted(missing)[:5]}")
        self.documents = self.documents[~self.documents["doc_id"].isin(doc_ids)].reset_index(drop=True)
        self._index()
        return len(doc_ids)
