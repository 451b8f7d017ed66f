"""Reader for BEIR-format directories: corpus.jsonl, queries.jsonl, qrels/{train,dev,test}.tsv."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from model_code.data.tables import (
    CORPUS_COLUMNS,
    QREL_COLUMNS,
    QUERY_COLUMNS,
    SPLITS,
    IngestError,
    RawDataset,
    empty,
    reject_record,
)

# BEIR field name -> canonical column, per table.
CORPUS_FIELDS = {"_id": "doc_id", "title": "title", "text": "text"}
QUERY_FIELDS = {"_id": "query_id", "text": "text"}


def read_beir(directory: str | Path) -> RawDataset:
    directory = Path(directory)
    corpus_file = directory / "corpus.jsonl"
    if not corpus_file.is_file():
        raise IngestError(f"{directory}: not a BEIR directory (no corpus.jsonl)")
    rejects: list[dict] = []
    corpus = read_jsonl_table(corpus_file, "corpus", CORPUS_FIELDS, required=("_id", "text"), rejects=rejects)
    queries_file = directory / "queries.jsonl"
    queries = (
        read_jsonl_table(queries_file, "queries", QUERY_FIELDS, required=("_id", "text"), rejects=rejects)
        if queries_file.is_file()
        else empty(QUERY_COLUMNS)
    )
    qrels = {
        split: _read_qrels_tsv(directory / "qrels" / f"{split}.tsv")
        for split in SPLITS
        if (directory / "qrels" / f"{split}.tsv").is_file()
    }
    return RawDataset(corpus=corpus, queries=queries, qrels=qrels, rejects=rejects)


def read_jsonl_table(
    path: Path, table: str, fields: dict[str, str], required: tuple[str, ...], rejects: list[dict],
    flags: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Parse a JSONL file; malformed JSON stops with file:line, a missing field rejects the row.
    ``flags`` are optional true/false fields (a batch's ``deleted``), kept as columns of their own."""
    rows = []
    for line_no, line in enumerate(_utf8_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise IngestError(f"{path}:{line_no}: malformed JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise IngestError(f"{path}:{line_no}: JSON nested too deeply to read") from None
        except ValueError as exc:  # valid JSON Python will not read: an integer of more than 4,300 digits
            raise IngestError(f"{path}:{line_no}: unreadable JSON ({str(exc)[:200]})") from None
        if not isinstance(record, dict):
            raise IngestError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
        row = {column: record.get(name) for name, column in fields.items()}
        row.update(source=path.name, line=line_no)
        missing = next((name for name in required if record.get(name) is None), None)
        if missing is not None:
            rejects.append(reject_record(table, row, f"missing field '{missing}'", field=fields[missing]))
            continue
        wrong = next((name for name in fields if not isinstance(record.get(name), str | None)), None)
        if wrong is not None:  # never turned into text silently: 42 is not the id "42"
            kind = type(record[wrong]).__name__
            rejects.append(reject_record(table, row, f"field '{wrong}' must be a string, got {kind}", field=fields[wrong]))
            continue
        flag = next((name for name in flags if not isinstance(record.get(name), bool | None)), None)
        if flag is not None:
            rejects.append(reject_record(table, row, f"field '{flag}' must be true or false, got {record[flag]!r:.40}",
                                         field=flag))
            continue
        rows.append({**row, **{name: record.get(name) for name in flags}})
    columns = list(fields.values()) + list(flags)
    frame = pd.DataFrame(rows, columns=columns + ["source", "line"]) if rows else empty(columns)
    if "title" in frame:
        frame["title"] = frame["title"].fillna("")
    return frame


def _utf8_text(path: Path) -> str:
    """The file as text, without a byte-order mark (editors on Windows write one); a file that is
    not UTF-8 is rejected whole, naming the first bad byte."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise IngestError(f"{path}: not UTF-8 text: byte {exc.start} (line {line}) is {raw[exc.start:exc.start + 1]!r} "
                          f"({exc.reason}); save the file as UTF-8") from None


def _read_qrels_tsv(path: Path) -> pd.DataFrame:
    """Parse ``query-id<TAB>corpus-id<TAB>score`` lines (header optional, CRLF accepted)."""
    rows = []
    text = _utf8_text(path).replace("\r\n", "\n").replace("\r", "\n")  # any newline convention, as before
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if line_no == 1 and parts[0].strip().lower() in {"query-id", "query_id", "qid"}:
            continue
        if len(parts) != 3:
            raise IngestError(
                f"{path}:{line_no}: expected 3 tab-separated fields (query-id, corpus-id, score), "
                f"got {len(parts)}"
            )
        rows.append(
            {"query_id": parts[0], "doc_id": parts[1], "relevance": parts[2], "source": path.name, "line": line_no}
        )
    return pd.DataFrame(rows, columns=QREL_COLUMNS + ["source", "line"]) if rows else empty(QREL_COLUMNS)


__all__ = ["CORPUS_COLUMNS", "read_beir"]
