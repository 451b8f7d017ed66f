"""The canonical in-memory form of a retrieval dataset, whatever its source format.

Readers turn BEIR directories, parquet files, Hugging Face datasets and the built-in corpus into
a ``RawDataset``. Every row keeps ``source`` (file name) and ``line`` (1-based line or row
number) so validation can say exactly which input row it rejected and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

CORPUS_COLUMNS = ["doc_id", "title", "text"]
QUERY_COLUMNS = ["query_id", "text"]
QREL_COLUMNS = ["query_id", "doc_id", "relevance"]
PROVENANCE = ["source", "line"]
SPLITS = ("train", "dev", "test")


class IngestError(ValueError):
    """A source that cannot be parsed at all; the message names file, line and field."""


@dataclass
class RawDataset:
    corpus: pd.DataFrame
    queries: pd.DataFrame = field(default_factory=lambda: empty(QUERY_COLUMNS))
    qrels: dict[str, pd.DataFrame] = field(default_factory=dict)
    rejects: list[dict] = field(default_factory=list)
    """Rows dropped while reading (e.g. a missing field), in the same format as validation rejects."""


def empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns + PROVENANCE})


def reject_record(table: str, row: dict, reason: str, field: str | None = None) -> dict:
    """One line of the rejects file: where the row came from, which field failed and why."""
    payload = {k: v for k, v in row.items() if k not in PROVENANCE}
    return {
        "table": table,
        "source": row.get("source"),
        "line": None if row.get("line") is None else int(row["line"]),
        "field": field,
        "reason": reason,
        "row": {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in payload.items()},
    }
