"""Stage 1, corpus ingestion: read a source, validate it, split it, write parquet atomically.

Outputs (``Layout.ingested``): corpus.parquet, queries.parquet, qrels/<split>.parquet,
doc_groups.parquet (old/new/tune), query_groups.parquet. Reports (``Layout.ingest_report``):
summary.json, rejects.jsonl, expectations.json and data_docs/ (great-expectations HTML).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from model_code.config import DataParams, Params
from model_code.data.batches import DocumentBatch, describe_reject
from model_code.data.beir import read_beir
from model_code.data.default_corpus import build_default_corpus
from model_code.data.expectations import run_expectations
from model_code.data.frames import read_hf, read_parquet_dir
from model_code.data.splits import carve_dev, group_queries, split_documents
from model_code.data.tables import CORPUS_COLUMNS, QREL_COLUMNS, QUERY_COLUMNS, IngestError, RawDataset
from model_code.data.validation import validate_dataset
from model_code.freshness.inbox import Inbox
from model_code.io import atomic_path
from model_code.layout import Layout

log = logging.getLogger(__name__)

_READERS: dict[str, Callable[[str], RawDataset]] = {
    "beir": read_beir,
    "parquet": read_parquet_dir,
    "hf": read_hf,
}


def read_source(params: DataParams, base_dir: Path) -> tuple[RawDataset, list[tuple[str, DocumentBatch]]]:
    """The configured source, and with ``include_incoming`` every included inbox batch (its id
    and its changes, read with the limits it was accepted under), in ledger order, all read at
    one ledger position: what a full retrain ingests, and exactly the batches it then claims."""
    raw = _read_configured_source(params, base_dir)
    if not params.include_incoming:
        return raw, []
    inbox = Inbox(Layout(base_dir).inbox, data=params)
    return raw, [(batch.batch_id, inbox.read(batch)) for batch in inbox.included()]


def apply_batches(corpus: pd.DataFrame, batches: list[tuple[str, DocumentBatch]]) -> pd.DataFrame:
    """The validated corpus with each batch applied in order, as an update applies it: a
    document replaces the one with its id, a deletion removes it (queries are unchanged)."""
    for _, changes in batches:
        replaced = set(changes.deleted) | set(changes.documents["doc_id"])
        corpus = pd.concat([corpus[~corpus["doc_id"].isin(replaced)], changes.documents], ignore_index=True)
    if batches:
        log.info("applied %d accepted inbox batches to the corpus", len(batches))
    return corpus


def _read_configured_source(params: DataParams, base_dir: Path) -> RawDataset:
    if params.source == "default":
        return build_default_corpus(params.default_corpus)
    path = Path(params.path)
    if not path.is_absolute():
        path = base_dir / path
    if not path.exists():
        raise IngestError(f"data.path {path} does not exist (data.source={params.source})")
    return _READERS[params.source](path)


def run(settings: Params, layout: Layout) -> dict:
    """Ingest the configured source; return the summary written to ``summary.json``."""
    params = settings.data
    raw, batches = read_source(params, layout.root)
    log.info("read %d documents, %d queries from %s source", len(raw.corpus), len(raw.queries), params.source)
    data = validate_dataset(raw, params)
    data.corpus = apply_batches(data.corpus, batches)  # validated when accepted, with the limits of that time
    if data.corpus.empty:
        first = f"; first: {describe_reject(data.rejects[0])}" if data.rejects else ""
        raise IngestError(f"no valid documents in the {params.source} source ({len(data.rejects)} rows rejected{first})")
    qrels = carve_dev(data.qrels, params.dev_fraction, params.seed)
    doc_groups = split_documents(data.corpus["doc_id"], params.split_fractions, params.seed)
    query_groups = group_queries(qrels, doc_groups)

    with atomic_path(layout.ingest_report) as report_dir:
        report_dir.mkdir()
        with open(report_dir / "rejects.jsonl", "w") as handle:
            handle.writelines(json.dumps(record, default=str) + "\n" for record in data.rejects)
        quality = run_expectations(data.corpus, params, report_dir)
        summary = {
            "source": params.source,
            "documents": len(data.corpus),
            "queries": len(data.queries),
            "qrels": {split: len(frame) for split, frame in sorted(qrels.items())},
            "judged_queries": {split: int(frame["query_id"].nunique()) for split, frame in sorted(qrels.items())},
            # qrels naming documents not in the corpus, kept for evaluation as BEIR does (training skips them)
            "qrels_missing_documents": {split: int((~frame["doc_id"].isin(data.corpus["doc_id"])).sum())
                                        for split, frame in sorted(qrels.items())},
            "doc_groups": doc_groups["group"].value_counts().to_dict(),
            "rejected_rows": len(data.rejects),
            # the inbox batches a retrain's corpus holds (registration tags them; rollback reads them)
            "incoming_batches": [batch_id for batch_id, _ in batches],
            "expectations_success": quality["success"],
            "expectations": quality["expectations"],
        }
        (report_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")

    with atomic_path(layout.ingested) as out:
        (out / "qrels").mkdir(parents=True)
        data.corpus[CORPUS_COLUMNS].to_parquet(out / "corpus.parquet", index=False)
        data.queries[QUERY_COLUMNS].to_parquet(out / "queries.parquet", index=False)
        for split, frame in qrels.items():
            frame[QREL_COLUMNS].to_parquet(out / "qrels" / f"{split}.parquet", index=False)
        doc_groups.to_parquet(out / "doc_groups.parquet", index=False)
        query_groups.to_parquet(out / "query_groups.parquet", index=False)
    if data.rejects:
        log.warning("%d rows rejected; see %s", len(data.rejects), layout.ingest_report / "rejects.jsonl")
    return summary
