"""Row-level validation of corpus, queries and qrels with pandera: the one document contract.

Every way a document enters (corpus ingest, ``submit-documents``, a file dropped in the inbox,
``add-documents``, ``edit-documents``) validates it with ``corpus_schema(params.data)``, so a
document is accepted or rejected the same way whichever way it came; the text-length limits are
``data.min_text_chars`` and ``data.max_text_chars``, the id-length limit ``data.max_id_chars``.
A row that fails a check is not fatal: it is removed and recorded (table, source file, line,
field, reason) so the rejects file tells the user exactly what to fix. Duplicated ids keep their
first occurrence. Qrels are checked against the queries that survived validation; a qrel naming
a document missing from the corpus is kept, as BEIR keeps it (``qrels_schema``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

from model_code.config import DataParams
from model_code.data.tables import RawDataset, reject_record


def _non_empty(series: pd.Series) -> pd.Series:
    return series.map(lambda v: isinstance(v, str) and v.strip() != "")


def _first_occurrence(series: pd.Series) -> pd.Series:
    return ~series.duplicated(keep="first")


INT64_RANGE = range(-(2**63), 2**63)


def as_integer(value) -> int | None:
    """``value`` (a judgement's relevance: "1", "2.0", 1) as the int64 it stores, or None where it is
    no whole number an int64 holds (inf, 1e400, 1e30, 2.5). Digits are read exactly, not through a float."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            return None
        if not as_float.is_integer():  # inf and NaN are not either
            return None
        number = int(as_float)
    if isinstance(value, float) and value != number:  # int() of a float truncates: 2.5 is not 2
        return None
    return number if number in INT64_RANGE else None


def _is_integer(series: pd.Series) -> pd.Series:
    return series.map(lambda value: as_integer(value) is not None)


def _encodable(series: pd.Series) -> pd.Series:
    return series.map(lambda v: not isinstance(v, str) or encodable_text(v))


def encodable_text(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: a lone surrogate (JSON ``"\\ud800"`` is valid JSON
    and pure ASCII) decodes to a ``str`` that no tokenizer, parquet file or HTTP response can
    encode, so it is refused where it enters, never found later by a failing update."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


NON_EMPTY = pa.Check(_non_empty, name="non_empty", error="must be a non-empty string", ignore_na=False)
ENCODABLE = pa.Check(_encodable, name="encodable", ignore_na=False,
                     error="not encodable as UTF-8 (a lone surrogate such as \\ud800)")
UNIQUE = pa.Check(_first_occurrence, name="unique", error="duplicate id (an earlier row has it)", ignore_na=False)
# TREC run and qrels files separate their fields by whitespace: an id holding any would be read
# back as other fields (a run.trec line trec_eval misreads), so ids are single tokens, as BEIR's are
SINGLE_TOKEN = pa.Check(lambda s: s.map(lambda v: not isinstance(v, str) or not any(c.isspace() for c in v)),
                        name="single_token", ignore_na=False,
                        error="must hold no whitespace (TREC run and qrels files separate fields by it)")


def _length_check(field: str, low: int, high: int, key: str) -> pa.Check:
    # an empty value is the non_empty check's business (one reason per fault)
    return pa.Check(lambda s: s.map(lambda v: not isinstance(v, str) or not v.strip() or low <= len(v) <= high),
                    name=f"{field}_length", ignore_na=False,
                    error=f"length must be {low}..{high} characters (data.{key})")


def _doc_id_column(data: DataParams) -> pa.Column:
    return pa.Column(None, [NON_EMPTY, UNIQUE, ENCODABLE, SINGLE_TOKEN,
                            _length_check("doc_id", 1, data.max_id_chars, "max_id_chars")], nullable=True)


def deletion_schema(data: DataParams) -> pa.DataFrameSchema:
    """A batch's deletion rows (``"deleted": true``): an id under the same contract as a document's."""
    return pa.DataFrameSchema({"doc_id": _doc_id_column(data)}, name="corpus")


def corpus_schema(data: DataParams) -> pa.DataFrameSchema:
    """Documents: a non-empty id of no whitespace, unique in its file and at most ``data.max_id_chars`` long, a
    non-empty text of ``data.min_text_chars``..``data.max_text_chars`` characters, every field
    encodable as UTF-8."""
    return pa.DataFrameSchema(
        {
            "doc_id": _doc_id_column(data),
            "title": pa.Column(None, [ENCODABLE, _length_check("title", 0, data.max_text_chars, "max_text_chars")],
                               nullable=True),
            "text": pa.Column(None, [NON_EMPTY, ENCODABLE, _length_check("text", data.min_text_chars, data.max_text_chars,
                                                                         "min_text_chars / data.max_text_chars")],
                              nullable=True),
        },
        name="corpus",
    )


def queries_schema() -> pa.DataFrameSchema:
    return pa.DataFrameSchema(
        {
            "query_id": pa.Column(None, [NON_EMPTY, UNIQUE, ENCODABLE, SINGLE_TOKEN], nullable=True),
            "text": pa.Column(None, [NON_EMPTY, ENCODABLE], nullable=True),
        },
        name="queries",
    )


def qrels_schema(query_ids: set[str]) -> pa.DataFrameSchema:
    """Judgements of known queries. A document id need not be in the corpus: BEIR keeps such a row,
    so its query is still scored (0 when none of its documents is there) and the document still
    counts in the ideal DCG and in recall's denominator; whatever trains on qrels skips the row."""
    return pa.DataFrameSchema(
        {
            "query_id": pa.Column(
                None, pa.Check(lambda s: s.isin(query_ids), name="known_query", error="unknown query id", ignore_na=False),
                nullable=True,
            ),
            "doc_id": pa.Column(None, NON_EMPTY, nullable=True),
            "relevance": pa.Column(
                None, pa.Check(_is_integer, name="integer", error="relevance must be an integer", ignore_na=False), nullable=True
            ),
        },
        name="qrels",
    )


@dataclass
class ValidatedDataset:
    corpus: pd.DataFrame
    queries: pd.DataFrame
    qrels: dict[str, pd.DataFrame]
    rejects: list[dict]


def validate_table(frame: pd.DataFrame, schema: pa.DataFrameSchema, table: str) -> tuple[pd.DataFrame, list[dict]]:
    """Split ``frame`` into accepted rows and reject records (one per failing row, reasons joined)."""
    frame = frame.reset_index(drop=True)
    try:
        schema.validate(frame, lazy=True)
        return frame, []
    except SchemaErrors as errors:
        cases = errors.failure_cases
    row_cases = cases[cases["index"].notna()]
    if len(row_cases) < len(cases):  # schema-level failure (missing column, ...): nothing row-specific
        raise ValueError(f"{table}: schema failure:\n{cases[cases['index'].isna()].to_string()}")
    reasons: dict[int, list[tuple[str, str]]] = {}
    for _, case in row_cases.iterrows():
        check = schema.columns[case["column"]].checks
        message = next((c.error for c in check if c.name == str(case["check"])), str(case["check"]))
        reasons.setdefault(int(case["index"]), []).append((case["column"], message))
    rejects = []
    for index, failures in sorted(reasons.items()):
        row = frame.loc[index].to_dict()
        fields = sorted({f for f, _ in failures})
        text = "; ".join(f"{f}: {m}" for f, m in failures)
        rejects.append(reject_record(table, row, text, field=",".join(fields)))
    return frame.drop(index=list(reasons)).reset_index(drop=True), rejects


def validate_dataset(raw: RawDataset, data: DataParams) -> ValidatedDataset:
    corpus, rejects = validate_table(raw.corpus, corpus_schema(data), "corpus")
    queries, query_rejects = validate_table(raw.queries, queries_schema(), "queries")
    rejects = list(raw.rejects) + rejects + query_rejects
    corpus["title"] = corpus["title"].fillna("")
    schema = qrels_schema(set(queries["query_id"]))
    qrels = {}
    for split, frame in raw.qrels.items():
        accepted, split_rejects = validate_table(frame, schema, f"qrels/{split}")
        accepted["relevance"] = accepted["relevance"].map(as_integer).astype("int64")
        qrels[split] = accepted
        rejects += split_rejects
    return ValidatedDataset(corpus=corpus, queries=queries, qrels=qrels, rejects=rejects)
