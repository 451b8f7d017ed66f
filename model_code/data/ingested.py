"""Read back the ingestion stage's outputs (the contract between ingestion and later stages)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass
class IngestedData:
    corpus: pd.DataFrame
    queries: pd.DataFrame
    qrels: dict[str, pd.DataFrame]

    def qrels_for(self, split: str) -> pd.DataFrame:
        if split not in self.qrels:
            raise KeyError(f"the ingested data has no '{split}' qrels (has {sorted(self.qrels)})")
        return self.qrels[split]

    def passages(self) -> list[str]:
        return passage_texts(self.corpus)


def passage_texts(documents: pd.DataFrame) -> list[str]:
    """Document text as encoded everywhere: title and text joined by ". " (BEIR's evaluation joins
    them by one space: not followed yet, as it changes every encoded vector and measured result)."""
    return [f"{t}. {x}" if t else x for t, x in zip(documents["title"], documents["text"])]


def load_ingested(directory: str | Path) -> IngestedData:
    directory = Path(directory)
    if not (directory / "corpus.parquet").is_file():
        raise FileNotFoundError(f"{directory}: no ingested corpus; run the ingest stage first")
    return IngestedData(
        corpus=pd.read_parquet(directory / "corpus.parquet"),
        queries=pd.read_parquet(directory / "queries.parquet"),
        qrels={p.stem: pd.read_parquet(p) for p in sorted((directory / "qrels").glob("*.parquet"))},
    )
