"""Apply document batches to a workspace's (or deployment's) retriever: validated, atomic, versioned.

The retriever kind does the work (``Retriever.add`` / ``remove`` / ``edit``: encode and append for
dense, IncDSI row optimisation for incdsi, re-indexing for bm25); this module makes it safe and
kind-agnostic. Writers hold a lock (``versions_lock``) from loading their base to committing, so
two at once never branch from the same version. Each successful batch writes a new version under
``models/retriever_versions/vNNNN`` (rejects, manifest with timings, and what the update changed:
the kind's delta, or the whole retriever every ``freshness.full_copy_every`` versions and for kinds
without deltas) and only then moves the ``CURRENT`` pointer with ``os.replace``. A batch is applied whole or not at
all: a crash or a bad batch leaves ``CURRENT`` on the previous version, which stays loadable.
Before the first update the index stage's own retriever (``models/retriever``, "base") is
current. Batches are JSONL (BEIR corpus lines: ``_id``, ``title``, ``text``; ``deleted: true``
rows remove) or parquet, validated with the ingestion schemas; rejected rows go to
``rejects.jsonl`` with a reason. ``add`` and ``edit`` (the CLI commands) refuse ids that are
indexed or not; ``upsert`` (the freshness loop) adds, replaces and removes. A file whose content
was applied before is skipped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from model_code.config import Params
from model_code.data.batches import describe_reject, read_document_batch
from model_code.data.document_store import DocumentStore
from model_code.data.tables import IngestError, reject_record
from model_code.io import atomic_path, exclusive_lock, file_sha256
from model_code.layout import Layout
from model_code.retrievers import (
    Retriever,
    UpdateContext,
    load_chain,
    read_manifest,
    save_retriever,
    save_retriever_delta,
)


class RetrieverVersions:
    """The versions of one workspace's retriever: ``base`` (the index stage's) and vNNNN."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.root = layout.retriever_versions
        self.base = layout.retriever

    @property
    def current_name(self) -> str:
        pointer = self.root / "CURRENT"
        return pointer.read_text().strip() if pointer.exists() else "base"

    def current_dir(self) -> Path:
        return self.version_dir(self.current_name)

    def version_dir(self, name: str) -> Path:
        return self.base if name == "base" else self.root / name

    def load(self) -> Retriever:
        return self.load_version(self.current_name)

    def load_version(self, name: str) -> Retriever:
        return load_chain(self.chain(name), self.layout.encoder)

    def load_documents(self, name: str) -> DocumentStore | None:
        """The text of the documents version ``name`` holds (None: saved before versions kept it)."""
        return DocumentStore.load_chain(self.chain(name))

    def chain(self, name: str) -> list[Path]:
        """The directories that load version ``name``: the last whole copy at or before it, then
        the deltas after that copy, oldest first."""
        directories = [self.version_dir(name)]
        manifest = read_manifest(directories[0])
        while manifest.get("delta"):
            directories.append(self.version_dir(manifest["delta_of"]))
            manifest = read_manifest(directories[-1])
        return directories[::-1]

    def checkout(self, name: str) -> None:
        """Make an existing version (or ``base``) current, e.g. after a registry rollback."""
        if name != self.current_name:
            if name != "base" and not (self.root / name / "manifest.json").is_file():
                raise FileNotFoundError(f"{self.root / name}: no such retriever version")
            with atomic_path(self.root / "CURRENT") as pointer:
                pointer.write_text(name + "\n")

    def manifests(self, version: str | None = None) -> list[dict]:
        """Manifests of the versions from ``base`` (excluded) to ``version`` (default: the current
        one): the lineage that version holds."""
        chain, name = [], version or self.current_name
        while name != "base":
            manifest = read_manifest(self.root / name)
            chain.append(manifest)
            name = manifest["parent"]
        return chain[::-1]

    def applied_batches(self, version: str | None = None) -> set[str]:
        """Content hashes of the batches ``version`` (default: the current one) holds (a batch is
        never applied twice; one whose version was abandoned, e.g. by a rollback or a failed
        registration, may be)."""
        return {m.get("batch_sha256") for m in self.manifests(version)} - {None}

    def commit(self, retriever: Retriever, documents: DocumentStore | None, manifest: dict, rejects: list[dict],
               full_copy_every: int, parent: str | None = None) -> str:
        """Save ``retriever`` and its ``documents``, loaded from version ``parent`` (default: the
        current one) and changed since, as the next version: their deltas, or whole copies when the
        chain of deltas would reach ``full_copy_every`` or the kind keeps none; then make it current."""
        parent = parent or self.current_name
        existing = sorted(p.name for p in self.root.glob("v[0-9]*"))
        name = f"v{int(existing[-1][1:]) + 1 if existing else 1:04d}"
        info = {**manifest, "version": name, "parent": parent}
        with atomic_path(self.root / name) as out:
            as_delta = len(self.chain(parent)) < full_copy_every  # the chain's whole copy + its deltas, then this
            if not (as_delta and save_retriever_delta(retriever, out, store=documents, **info, delta_of=parent)):
                save_retriever(retriever, out, store=documents, **info)
            (out / "rejects.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rejects))
        with atomic_path(self.root / "CURRENT") as pointer:
            pointer.write_text(name + "\n")
        return name


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
    queries: pd.DataFrame | None = None, base: str | None = None,
) -> dict:
    """Apply an inbox batch the way users of vector stores expect (the freshness loop's updates):
    a new id is added, an indexed id's document is replaced (removed, then added with the batch's
    text, as ``Retriever.edit`` does by default), a deletion row removes its document. Every batch
    makes one version, even one that changes nothing (its deletions named no indexed id), so the
    chain of versions holds each applied batch exactly once."""
    return _apply(layout, params, batch, "upsert", UpdateContext(params, layout, embeddings, queries), base)


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
           base: str | None = None) -> dict:
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
                                              rejects, params.freshness.full_copy_every, parent=base)
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


def versions_lock(layout: Layout):
    """The lock every writer of ``layout``'s retriever versions holds from reading its base
    version to committing the next one: two updates at once (two ``add-documents``, a CLI edit
    during a sensor's update) run one after the other, each on the other's result."""
    return exclusive_lock(layout.retriever_versions.parent / ".versions.lock")
