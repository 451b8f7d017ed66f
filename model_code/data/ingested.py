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
        if split not in self.qrels:  # a ValueError: every entry point reports those as a clear error
            raise ValueError(f"the ingested data has no '{split}' qrels (it has {', '.join(sorted(self.qrels)) or 'none'}):"
                             f" add qrels/{split}.tsv to the data, or choose a split it has")
        if self.qrels[split].empty:  # every metric over no query is NaN: a selection or a promotion on it is no decision
            carved = " (data.dev_fraction carved no train query into it: raise it)" if split == "dev" else ""
            raise ValueError(f"the ingested data's '{split}' qrels hold no judgement{carved}; "
                             f"add judgements to qrels/{split}.tsv, or choose a split that has some")
        return self.qrels[split]

    def passages(self) -> list[str]:
        return passage_texts(self.corpus)


def passage_texts(documents: pd.DataFrame) -> list[str]:
    """Document text as encoded everywhere: title and text joined by one space, the ends stripped,
    as BEIR's evaluation encodes a corpus (``(title + " " + text).strip()``), so that a score
    compares with published ones (a title is used as written: one ending in a full stop keeps it)."""
    return [f"{t} {x}".strip() for t, x in zip(documents["title"], documents["text"])]


def load_ingested(directory: str | Path) -> IngestedData:
    directory = Path(directory)
    if not (directory / "corpus.parquet").is_file():
        raise FileNotFoundError(f"{directory}: no ingested corpus; run the ingest stage first")
    return IngestedData(
        corpus=pd.read_parquet(directory / "corpus.parquet"),
        queries=pd.read_parquet(directory / "queries.parquet"),
        qrels={p.stem: pd.read_parquet(p) for p in sorted((directory / "qrels").glob("*.parquet"))},
    )
