"""Document batches read and validated with the ingestion schemas.

A batch is a list of changes to the corpus, the way users of vector stores expect an upsert to
work: a row whose id is new adds a document, a row whose id is indexed replaces that document's
title and text, and a row ``{"_id": ..., "deleted": true}`` (parquet: a boolean ``deleted``
column) removes it. An id may appear once per batch; batches apply in the inbox ledger's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from model_code.config import DataParams
from model_code.data.beir import CORPUS_FIELDS, read_jsonl_table
from model_code.data.frames import to_table
from model_code.data.tables import IngestError, reject_record
from model_code.data.validation import corpus_schema, encodable_text, validate_table

DELETED = "deleted"


@dataclass
class DocumentBatch:
    documents: pd.DataFrame  # doc_id, title, text (+ source, line): added or replaced
    deleted: list[str] = field(default_factory=list)  # ids to remove
    rejects: list[dict] = field(default_factory=list)  # rows refused, each naming file, line, field and reason


def describe_reject(reject: dict) -> str:
    """``file:line: reason`` for one reject record, what every entry point prints."""
    where = f"{reject.get('source')}:{reject['line']}" if reject.get("line") is not None else str(reject.get("source"))
    return f"{where}: {reject['reason']}"


def read_document_batch(path: Path, data: DataParams) -> DocumentBatch:
    """The valid changes and the rejected rows of a JSONL (BEIR corpus lines) or parquet file,
    documents validated by the corpus contract with the limits of ``data``."""
    if not path.is_file():
        raise IngestError(f"{path}: no such batch file")
    rejects: list[dict] = []
    if path.suffix == ".jsonl":
        frame = read_jsonl_table(path, "corpus", CORPUS_FIELDS, required=("_id",), rejects=rejects, flags=(DELETED,))
    elif path.suffix == ".parquet":
        try:
            table = pd.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types on a damaged file (fuzzing found KeyError)
            raise IngestError(f"{path}: not a readable parquet file ({type(exc).__name__}: {str(exc)[:200]})") from None
        frame = to_table(table, "corpus", path.name)
        frame[DELETED] = table[DELETED].to_numpy() if DELETED in table else None
    else:
        raise IngestError(f"{path}: batches are .jsonl or .parquet files")
    deletions = frame[DELETED].map(lambda v: v is True or v == True).astype(bool)  # noqa: E712 - numpy.bool_ too
    removed, deleted = _deletions(frame[deletions], rejects)
    documents = frame[~deletions].drop(columns=DELETED)
    refused = {"text": documents["text"].isna(), "doc_id": documents["doc_id"].isin(removed)}
    reasons = {"text": "missing field 'text' (or \"deleted\": true to remove the document)",
               "doc_id": "duplicate id (a deletion row of this batch names it)"}
    for name, rows in refused.items():
        rejects += [reject_record("corpus", row, reasons[name], name) for row in documents[rows].to_dict("records")]
    keep = ~(refused["text"] | refused["doc_id"])
    accepted, schema_rejects = validate_table(documents[keep], corpus_schema(data), "corpus")
    accepted["title"] = accepted["title"].fillna("")
    rejects = sorted(rejects + schema_rejects, key=lambda r: (r["line"] is None, r["line"] or 0))
    return DocumentBatch(accepted, deleted, rejects)


def _deletions(rows: pd.DataFrame, rejects: list[dict]) -> tuple[set[str], list[str]]:
    """(every id a deletion row names, the valid ids to delete): a deletion is an encodable,
    non-empty string id named once in the batch."""
    deleted, named = [], set()
    for row in rows.to_dict("records"):
        doc_id = row["doc_id"]
        if not isinstance(doc_id, str) or not doc_id.strip() or not encodable_text(doc_id):
            rejects.append(reject_record("corpus", row, "doc_id: a deletion names a non-empty, encodable id", "doc_id"))
        elif doc_id in named:
            rejects.append(reject_record("corpus", row, "doc_id: duplicate id (an earlier row has it)", "doc_id"))
        else:
            deleted.append(doc_id)
        named.add(doc_id)
    return named, deleted
