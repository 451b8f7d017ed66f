"""Reader for tabular sources: parquet directories and Hugging Face ``datasets``.

Both arrive as column-oriented tables whose column names may follow BEIR (``_id``,
``corpus-id``, ``score``) or this project's canonical names; ``to_table`` maps either form onto
the canonical columns and records the row number for error messages.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from model_code.data.tables import (
    CORPUS_COLUMNS,
    QREL_COLUMNS,
    QUERY_COLUMNS,
    SPLITS,
    IngestError,
    RawDataset,
    empty,
)

_ALIASES = {
    "corpus": {"_id": "doc_id", "id": "doc_id", "corpus-id": "doc_id"},
    "queries": {"_id": "query_id", "id": "query_id", "query-id": "query_id", "query": "text"},
    "qrels": {"query-id": "query_id", "corpus-id": "doc_id", "score": "relevance", "label": "relevance"},
}
_COLUMNS = {"corpus": CORPUS_COLUMNS, "queries": QUERY_COLUMNS, "qrels": QREL_COLUMNS}
_OPTIONAL = {"title"}
_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def to_table(frame: pd.DataFrame, table: str, source: str, first_line: int = 1) -> pd.DataFrame:
    """Rename to canonical columns, check required ones exist, add provenance columns (``line``:
    the row's number, counted from ``first_line``: 2 for a CSV file, whose line 1 is its header)."""
    aliases, named = _ALIASES[table], {}
    for column in frame.columns:
        named.setdefault(aliases.get(column, column), []).append(column)
    for canonical, names in named.items():
        if len(names) > 1:  # renamed, they would be two columns of one name
            raise IngestError(f"{source}: columns {', '.join(map(repr, names))} all name the {canonical} column of the "
                              f"{table} table; keep one")
    frame = frame.rename(columns=aliases)
    columns = _COLUMNS[table]
    missing = [c for c in columns if c not in frame.columns and c not in _OPTIONAL]
    if missing:
        raise IngestError(
            f"{source}: missing column(s) {missing} for the {table} table (found {list(frame.columns)})"
        )
    out = pd.DataFrame({c: frame[c] if c in frame.columns else "" for c in columns})
    for column in columns:
        if column != "relevance":
            out[column] = out[column].map(_as_text)
    out["source"] = source
    out["line"] = range(first_line, len(out) + first_line)
    return out


def _as_text(value):
    """A cell as text: an empty cell (None, NaN, NA) stays empty, so the row is rejected as missing
    that field, never kept as the text "nan"; a whole number in a float column (an integer id
    column with an empty cell is read as floats) is the integer's digits, "7" and not "7.0"."""
    if value is None or isinstance(value, str):
        return value
    if pd.api.types.is_scalar(value) and pd.isna(value):
        return None
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def read_parquet_dir(directory: str | Path) -> RawDataset:
    """``corpus.parquet`` (+ ``queries.parquet``, ``qrels/<split>.parquet`` or ``qrels_<split>.parquet``)."""
    directory = Path(directory)
    corpus_file = directory / "corpus.parquet"
    if not corpus_file.is_file():
        raise IngestError(f"{directory}: no corpus.parquet")
    corpus = to_table(_read_parquet(corpus_file), "corpus", corpus_file.name)
    queries_file = directory / "queries.parquet"
    queries = (
        to_table(_read_parquet(queries_file), "queries", queries_file.name)
        if queries_file.is_file()
        else empty(QUERY_COLUMNS)
    )
    qrels = {}
    for split in SPLITS:
        for candidate in (directory / "qrels" / f"{split}.parquet", directory / f"qrels_{split}.parquet"):
            if candidate.is_file():
                qrels[split] = to_table(_read_parquet(candidate), "qrels", candidate.name)
                break
    return RawDataset(corpus=corpus, queries=queries, qrels=qrels)


def read_hf(path: str | Path) -> RawDataset:
    """A ``DatasetDict`` saved with ``save_to_disk`` (keys corpus, queries, qrels_<split>), or a
    single local file (jsonl/json/csv/parquet) loaded through ``datasets`` as a corpus."""
    import datasets

    path = Path(path)
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix)
        if builder is None:
            raise IngestError(f"{path}: unsupported file type {path.suffix!r} (use {sorted(_FILE_BUILDERS)})")
        loaded = _loading(path, lambda: datasets.load_dataset(builder, data_files=str(path), split="train"))
        return RawDataset(corpus=to_table(loaded.to_pandas(), "corpus", path.name, 2 if builder == "csv" else 1))
    if not path.is_dir():
        raise IngestError(f"{path}: no such Hugging Face dataset directory or file")
    loaded = _loading(path, lambda: datasets.load_from_disk(str(path)))
    if isinstance(loaded, datasets.Dataset):
        return RawDataset(corpus=to_table(loaded.to_pandas(), "corpus", path.name))
    if "corpus" not in loaded:
        raise IngestError(f"{path}: DatasetDict has no 'corpus' split (found {list(loaded)})")
    return RawDataset(
        corpus=to_table(loaded["corpus"].to_pandas(), "corpus", f"{path.name}[corpus]"),
        queries=(
            to_table(loaded["queries"].to_pandas(), "queries", f"{path.name}[queries]")
            if "queries" in loaded
            else empty(QUERY_COLUMNS)
        ),
        qrels={
            split: to_table(loaded[f"qrels_{split}"].to_pandas(), "qrels", f"{path.name}[qrels_{split}]")
            for split in SPLITS
            if f"qrels_{split}" in loaded
        },
    )


def _loading(path: Path, load):
    """``load()``, whose failures (``datasets`` raises its own types for a malformed file) name the path."""
    try:
        return load()
    except Exception as exc:  # noqa: BLE001 - DatasetGenerationError, ArrowInvalid, FileNotFoundError, ...
        cause = exc.__cause__ or exc  # datasets wraps the reader's error, which says what is wrong
        raise IngestError(f"{path}: cannot be read as a Hugging Face dataset "
                          f"({type(cause).__name__}: {str(cause)[:300]})") from None


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several unrelated types for corrupt files
        raise IngestError(f"{path}: cannot read parquet ({exc})") from None
