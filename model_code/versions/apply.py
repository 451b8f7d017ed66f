"""Apply document batches to a workspace's (or deployment's) retriever: validated, atomic, versioned.

The retriever kind does the work (``Retriever.add`` / ``remove`` / ``edit``: encode and append for
dense, IncDSI row optimisation for incdsi, re-indexing for bm25); this module makes it safe and
kind-agnostic. Each function holds ``versions_lock`` from loading its base version to committing
the next (``versions.chain``), so a batch is applied whole or not at all: a crash or a bad batch
leaves ``CURRENT`` on the previous version. Batches are JSONL (BEIR corpus lines: ``_id``,
``title``, ``text``; ``deleted: true`` rows remove) or parquet, validated with the ingestion
schemas; rejected rows go to the version's ``rejects.jsonl`` with a reason. ``add`` and ``edit``
(the CLI commands) refuse ids that are indexed or not; ``upsert`` (the freshness loop) adds,
replaces and removes. A file whose content was applied before is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pandas as pd

from model_code.config import Params
from model_code.data.batches import describe_reject, read_document_batch
from model_code.data.tables import IngestError, reject_record
from model_code.io import file_sha256
from model_code.layout import Layout
from model_code.retrievers import UpdateContext
from model_code.versions.chain import RetrieverVersions, versions_lock


def add_documents(
    layout: Layout, params: Params, batch: Path, embeddings: dict[str, np.ndarray] | None = None,
    queries: pd.DataFrame | None = None, base: str | None = None,
) -> dict:
    """Apply one batch file of new documents to version ``base`` (default: the current one);
    an indexed id is refused (``fresh-retriever add-documents``). Work already done upstream can
    be passed in: ``embeddings`` (doc id -> vector from the deployed encoder, e.g. the drift
    report's) and ``queries`` (doc_id, query: the batch's generated queries), for kinds that use them."""
    return _apply(layout, params, batch, "add", UpdateContext(params, layout, embeddings, queries), base)


def edit_documents(layout: Layout, params: Params, batch: Path) -> dict:
    """Replace indexed documents by the batch's new versions (the kind's ``edit``); a new id is refused."""
    return _apply(layout, params, batch, "edit", UpdateContext(params, layout))


def upsert_documents(
    layout: Layout, params: Params, batch: Path, embeddings: dict[str, np.ndarray] | None = None,
    queries: pd.DataFrame | None = None, base: str | None = None, taken: Collection[str] = (),
) -> dict:
    """Apply an inbox batch the way users of vector stores expect (the freshness loop's updates):
    a new id is added, an indexed id's document is replaced (removed, then added with the batch's
    text, as ``Retriever.edit`` does by default), a deletion row removes its document. Every batch
    makes one version, even one that changes nothing (its deletions named no indexed id), so the
    chain of versions holds each applied batch exactly once. The new version is named after every
    version on disk and in ``taken`` (versions written elsewhere: ``RetrieverVersions.commit``)."""
    return _apply(layout, params, batch, "upsert", UpdateContext(params, layout, embeddings, queries), base, taken)


DELETION_REFUSED = {
    "upsert": "doc_id: not indexed, nothing to delete",
    "add": "deleted: a deletion is applied through the inbox or fresh-retriever remove-documents",
    "edit": "deleted: a deletion is applied through the inbox or fresh-retriever remove-documents",
}
REFUSED = {  # the command that does what the row asked (or submit the file to the inbox: it upserts)
    "add": "doc_id: already indexed (to replace its text: fresh-retriever edit-documents {batch})",
    "edit": "doc_id: not indexed (to add it: fresh-retriever add-documents {batch})",
}


def _apply(layout: Layout, params: Params, batch: Path, operation: str, context: UpdateContext,
           base: str | None = None, taken: Collection[str] = ()) -> dict:
    start = time.perf_counter()
    with versions_lock(layout):
        versions = RetrieverVersions(layout)
        base = base or versions.current_name
        digest = file_sha256(batch)
        if digest in versions.applied_batches(base):
            return {"status": "skipped", "reason": "batch already applied", "batch_sha256": digest}
        changes = read_document_batch(batch, params.data)
        documents, rejects = changes.documents, changes.rejects
        retriever, store = versions.load_version(base), versions.load_documents(base)
        live = set(retriever.live_ids())
        indexed = documents["doc_id"].isin(live)
        deletions = changes.deletions
        indexed_deletion = deletions["doc_id"].isin(live)
        refused = deletions[~indexed_deletion] if operation == "upsert" else deletions
        deleted = deletions.loc[indexed_deletion, "doc_id"].tolist() if operation == "upsert" else []
        rejects += [reject_record("corpus", row, DELETION_REFUSED[operation], "doc_id") for row in refused.to_dict("records")]
        if operation != "upsert":
            wrong = indexed if operation == "add" else ~indexed
            reason = REFUSED[operation].format(batch=batch)
            rejects += [reject_record("corpus", row, reason, "doc_id") for row in documents[wrong].to_dict("records")]
            documents, indexed = documents[~wrong].reset_index(drop=True), indexed[~wrong].reset_index(drop=True)
            if documents.empty:  # never a silent skip: an id that exists with other text would be lost
                first = describe_reject(rejects[0]) if rejects else "empty file"
                raise IngestError(f"{batch}: no valid documents to {operation} ({len(rejects)} rows rejected; first: {first})")
        replaced = documents.loc[indexed, "doc_id"].tolist()
        timings = {}
        if operation == "edit":
            timings = retriever.edit(documents, context)
        else:
            if deleted or replaced:
                retriever.remove(deleted + replaced)
            if not documents.empty:
                timings = retriever.add(documents, context)
        if store is not None:  # the text a search returns, changed as the index was
            store.remove(deleted)
            store.upsert(documents)
        manifest = {"operation": operation, "batch": str(batch), "batch_sha256": digest,
                    "added": int((~indexed).sum()), "edited": len(replaced), "removed": len(deleted),
                    "doc_ids": documents["doc_id"].tolist(), "removed_ids": deleted, "rejected": len(rejects), **timings}
        manifest["version"] = versions.commit(retriever, store, {**manifest, "total_ms": 1000 * (time.perf_counter() - start)},
                                              rejects, params.freshness.full_copy_every, parent=base, taken=taken)
    manifest["documents"] = len(retriever.live_ids())
    return manifest


def remove_documents(layout: Layout, params: Params, doc_ids: list[str]) -> dict:
    with versions_lock(layout):
        versions = RetrieverVersions(layout)
        retriever, store = versions.load(), versions.load_documents(versions.current_name)
        start = time.perf_counter()
        removed = retriever.remove(doc_ids)
        if store is not None:
            store.remove(doc_ids)
        manifest = {"operation": "remove", "removed": removed, "doc_ids": doc_ids,
                    "remove_ms": 1000 * (time.perf_counter() - start)}
        manifest["version"] = versions.commit(retriever, store, manifest, [], params.freshness.full_copy_every)
    manifest["documents"] = len(retriever.live_ids())
    return manifest
