"""Reader for tabular sources: parquet directories and Hugging Face ``datasets``.

Both arrive as column-oriented tables whose column names may follow BEIR (``_id``,
``corpus-id``, ``score``) or this project's canonical names; ``to_table`` maps either form onto
the canonical columns and records the row number for error messages.
"""

from __future__ import annotations

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
)

_ALIASES = {
    "corpus": {"_id": "doc_id", "id": "doc_id", "corpus-id": "doc_id"},
    "queries": {"_id": "query_id", "id": "query_id", "query-id": "query_id", "query": "text"},
    "qrels": {"query-id": "query_id", "corpus-id": "doc_id", "score": "relevance", "label": "relevance"},
}
_COLUMNS = {"corpus": CORPUS_COLUMNS, "queries": QUERY_COLUMNS, "qrels": QREL_COLUMNS}
_OPTIONAL = {"title"}
_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def to_table(frame: pd.DataFrame, table: str, source: str) -> pd.DataFrame:
    """Rename to canonical columns, check required ones exist, add provenance columns."""
    frame = frame.rename(columns=_ALIASES[table])
    columns = _COLUMNS[table]
    missing = [c for c in columns if c not in frame.columns and c not in _OPTIONAL]
    if missing:
        raise IngestError(
            f"{source}: missing column(s) {missing} for the {table} table (found {list(frame.columns)})"
        )
    out = pd.DataFrame({c: frame[c] if c in frame.columns else "" for c in columns})
    for column in columns:
        if column != "relevance":
            out[column] = out[column].map(lambda v: v if isinstance(v, str) or v is None else str(v))
    out["source"] = source
    out["line"] = range(1, len(out) + 1)
    return out


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
        loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
        return RawDataset(corpus=to_table(loaded.to_pandas(), "corpus", path.name))
    if not path.is_dir():
        raise IngestError(f"{path}: no such Hugging Face dataset directory or file")
    loaded = datasets.load_from_disk(str(path))
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


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several unrelated types for corrupt files
        raise IngestError(f"{path}: cannot read parquet ({exc})") from None
