"""Document batches read and validated with the ingestion schemas.

A batch is a list of changes to the corpus, the way users of vector stores expect an upsert to
work: a row whose id is new adds a document, a row whose id is indexed replaces that document's
title and text, and a row ``{"_id": ..., "deleted": true}`` (parquet: a boolean ``deleted``
column; ``text`` may then be absent) removes it. An id may appear once per batch (a later row
naming it is rejected, whichever kind of row it is); batches apply in the inbox ledger's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from model_code.config import DataParams
from model_code.data.beir import CORPUS_FIELDS, read_jsonl_table
from model_code.data.frames import to_table
from model_code.data.tables import PROVENANCE, IngestError, reject_record
from model_code.data.validation import corpus_schema, deletion_schema, validate_table

DELETED = "deleted"


@dataclass
class DocumentBatch:
    documents: pd.DataFrame  # doc_id, title, text (+ source, line): added or replaced
    deletions: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["doc_id", *PROVENANCE]))
    rejects: list[dict] = field(default_factory=list)  # rows refused, each naming file, line, field and reason

    @property
    def deleted(self) -> list[str]:
        """The ids the batch removes."""
        return self.deletions["doc_id"].tolist()


def describe_reject(reject: dict) -> str:
    """``file:line: reason`` for one reject record, what every entry point prints."""
    where = f"{reject.get('source')}:{reject['line']}" if reject.get("line") is not None else str(reject.get("source"))
    return f"{where}: {reject['reason']}"


def read_document_batch(path: Path, data: DataParams, name: str | None = None) -> DocumentBatch:
    """The valid changes and the rejected rows of a JSONL (BEIR corpus lines) or parquet file,
    documents validated by the corpus contract with the limits of ``data``; ``name`` is what
    messages call the file (default: its own name; the inbox reads a copy of a dropped file)."""
    name = name or path.name
    if not path.is_file():
        raise IngestError(f"{path}: no such batch file")
    rejects: list[dict] = []
    if path.suffix == ".jsonl":
        try:
            frame = read_jsonl_table(path, "corpus", CORPUS_FIELDS, required=("_id",), rejects=rejects, flags=(DELETED,))
        except IngestError as exc:  # its messages name the path read; a given name is what the user knows
            raise IngestError(str(exc).replace(str(path), name) if name != path.name else str(exc)) from None
    elif path.suffix == ".parquet":
        frame = _read_parquet_batch(path, name)
    else:
        raise IngestError(f"{name}: batches are .jsonl or .parquet files")
    frame["source"] = name
    for reject in rejects:  # the reader's own rejects name the path it read: the inbox reads a copy
        reject["source"] = name
    frame = _first_rows_only(frame, rejects)
    deletions = frame[DELETED].map(lambda v: v is True).astype(bool)
    removed, deletion_rejects = validate_table(frame.loc[deletions, ["doc_id", *PROVENANCE]], deletion_schema(data),
                                               "corpus")
    documents = frame[~deletions].drop(columns=DELETED)
    missing_text = documents["text"].isna()
    rejects += [reject_record("corpus", row, "missing field 'text' (or \"deleted\": true to remove the document)", "text")
                for row in documents[missing_text].to_dict("records")]
    accepted, schema_rejects = validate_table(documents[~missing_text], corpus_schema(data), "corpus")
    accepted["title"] = accepted["title"].fillna("")
    rejects = sorted(rejects + deletion_rejects + schema_rejects, key=lambda r: (r["line"] is None, r["line"] or 0))
    return DocumentBatch(accepted, removed, rejects)


def _read_parquet_batch(path: Path, name: str) -> pd.DataFrame:
    """A parquet batch as canonical columns plus ``deleted`` (True, or None for a document row);
    a ``deleted`` value that is not a boolean rejects nothing silently: the file is refused."""
    try:
        table = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types on a damaged file (fuzzing found KeyError)
        raise IngestError(f"{name}: not a readable parquet file ({type(exc).__name__}: {str(exc)[:200]})") from None
    has_flags = DELETED in table
    flags = table.pop(DELETED) if has_flags else pd.Series([None] * len(table), dtype=object)
    if "text" not in table and has_flags:
        table["text"] = None  # deletions need no text; a document row without one is rejected below
    frame = to_table(table, "corpus", name)
    wrong = flags.map(lambda v: not (pd.isna(v) or isinstance(v, bool | np.bool_)))
    if wrong.any():
        row = int(wrong.to_numpy().argmax()) + 1
        raise IngestError(f"{name}: row {row}: column '{DELETED}' must be true, false or empty, "
                          f"got {flags.iloc[row - 1]!r:.40}")
    frame[DELETED] = [True if not pd.isna(v) and bool(v) else None for v in flags]
    return frame


def _first_rows_only(frame: pd.DataFrame, rejects: list[dict]) -> pd.DataFrame:
    """The rows whose id no earlier row of the batch names (document or deletion alike)."""
    named = frame["doc_id"].map(lambda v: isinstance(v, str))
    later = named & frame["doc_id"].where(named).duplicated(keep="first")
    rejects += [reject_record("corpus", row, "doc_id: duplicate id (an earlier row has it)", "doc_id")
                for row in frame[later].drop(columns=DELETED).to_dict("records")]
    return frame[~later].reset_index(drop=True)
