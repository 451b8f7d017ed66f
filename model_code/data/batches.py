"""Document batches (new or edited documents) read and validated with the ingestion schemas."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from model_code.config import DataParams
from model_code.data.beir import CORPUS_FIELDS, read_jsonl_table
from model_code.data.frames import to_table
from model_code.data.tables import IngestError
from model_code.data.validation import corpus_schema, validate_table


def read_document_batch(path: Path, data: DataParams) -> tuple[pd.DataFrame, list[dict]]:
    """(valid documents, rejected rows with reasons) of a JSONL (BEIR corpus lines) or parquet
    file, validated by the corpus contract with the limits of ``data``."""
    if not path.is_file():
        raise IngestError(f"{path}: no such batch file")
    rejects: list[dict] = []
    if path.suffix == ".jsonl":
        frame = read_jsonl_table(path, "corpus", CORPUS_FIELDS, required=("_id", "text"), rejects=rejects)
    elif path.suffix == ".parquet":
        try:
            table = pd.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types on a damaged file (fuzzing found KeyError)
            raise IngestError(f"{path}: not a readable parquet file ({type(exc).__name__}: {str(exc)[:200]})") from None
        frame = to_table(table, "corpus", path.name)
    else:
        raise IngestError(f"{path}: batches are .jsonl or .parquet files")
    accepted, schema_rejects = validate_table(frame, corpus_schema(data), "corpus")
    accepted["title"] = accepted["title"].fillna("")
    return accepted, rejects + schema_rejects
