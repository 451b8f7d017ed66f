"""A retriever = encoder + a searcher over document ids: the unit that is evaluated, logged and served.

Two searchers share one contract (``search(query_vectors, k) -> (scores, doc_ids)``, ``load(dir)``):
the dense FAISS index and the IncDSI document-id head. ``freshness.retriever`` picks which one a
deployment serves; everything above this module is agnostic of the choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_code.config import EncoderParams
from model_code.incremental.incdsi import IncDSIHead
from model_code.index.faiss_index import DocIndex
from model_code.models.encoder import Encoder

SEARCHERS: dict[str, type[DocIndex | IncDSIHead]] = {"dense": DocIndex, "incdsi": IncDSIHead}


@dataclass
class SearchHit:
    doc_ids: list[str]
    scores: list[float]


@dataclass
class Retriever:
    encoder: Encoder
    index: DocIndex | IncDSIHead
    max_query_length: int = 64
    batch_size: int = 64

    @classmethod
    def load(cls, encoder_dir: str | Path, searcher_dir: str | Path, encoder_params: EncoderParams,
             kind: str = "dense") -> Retriever:
        if kind not in SEARCHERS:
            raise ValueError(f"unknown retriever kind {kind!r} (use one of {tuple(SEARCHERS)})")
        return cls(
            encoder=Encoder(str(encoder_dir), encoder_params.pooling),
            index=SEARCHERS[kind].load(searcher_dir),
            max_query_length=encoder_params.max_query_length,
            batch_size=encoder_params.batch_size,
        )

    def search(self, queries: list[str], k: int = 10, desc: str | None = None) -> list[SearchHit]:
        vectors = self.encoder.encode(queries, self.max_query_length, self.batch_size, desc=desc)
        scores, ids = self.index.search(vectors, k)
        return [SearchHit(doc_ids=row_ids, scores=row[: len(row_ids)].tolist()) for row, row_ids in zip(scores, ids)]
