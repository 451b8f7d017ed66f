"""Apply document batches to the deployed retriever: validated, atomic, versioned.

Two retriever kinds share this interface, so callers (CLI, sensor) do not care which is deployed:

* ``dense``: encode the new documents and ``add_with_ids`` them to the FAISS index (HCE §5.3);
* ``incdsi``: generate queries for each new document and optimise its row of the document-id
  head with IncDSI (``incdsi.py``); a document whose constraints cannot all be met is still
  added and is counted in ``not_separable``.

Each successful batch writes a complete new version under ``models/<kind>_versions/vNNNN``
(retriever files, rejects, manifest with timings) and only then moves the ``CURRENT`` pointer
with ``os.replace``. A batch is applied whole or not at all: a crash or a bad batch leaves
``CURRENT`` on the previous version, which stays loadable. Before the first update the
pipeline's own artifact (``models/index`` or ``models/incdsi_head``) is current. Batches are
JSONL (BEIR corpus lines: ``_id``, ``title``, ``text``) or parquet, validated with the ingestion
schemas; rejected rows (bad fields, ids already present) go to ``rejects.jsonl`` with a reason.
A file whose content was applied before is skipped.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from model_code.config import Params
from model_code.data.beir import CORPUS_FIELDS, read_jsonl_table
from model_code.data.frames import to_table
from model_code.data.generator import generate_queries
from model_code.data.ingested import passage_texts
from model_code.data.tables import IngestError, reject_record
from model_code.data.validation import corpus_schema, validate_table
from model_code.incremental.incdsi import AdditionParams, IncDSIHead
from model_code.index.faiss_index import DocIndex
from model_code.io import atomic_path, file_sha256
from model_code.layout import Layout
from model_code.models.encoder import Encoder
from model_code.retriever import SEARCHERS

KINDS = tuple(SEARCHERS)


class RetrieverVersions:
    def __init__(self, layout: Layout, kind: str = "dense"):
        if kind not in KINDS:
            raise ValueError(f"unknown retriever kind {kind!r} (use one of {KINDS})")
        self.layout, self.kind = layout, kind
        self.root = layout.root / "models" / ("index_versions" if kind == "dense" else "incdsi_versions")
        self.base = layout.searcher(kind)

    @property
    def current_name(self) -> str:
        pointer = self.root / "CURRENT"
        return pointer.read_text().strip() if pointer.exists() else "base"

    def current_dir(self) -> Path:
        return self.version_dir(self.current_name)

    def version_dir(self, name: str) -> Path:
        return self.base if name == "base" else self.root / name

    def load(self) -> DocIndex | IncDSIHead:
        return self.load_version(self.current_name)

    def load_version(self, name: str) -> DocIndex | IncDSIHead:
        return SEARCHERS[self.kind].load(self.version_dir(name))

    def checkout(self, name: str) -> None:
        """Make an existing version (or ``base``) current, e.g. after a registry rollback."""
        if name != self.current_name:
            if name != "base" and not (self.root / name / "manifest.json").is_file():
                raise FileNotFoundError(f"{self.root / name}: no such retriever version")
            with atomic_path(self.root / "CURRENT") as pointer:
                pointer.write_text(name + "\n")

    def manifests(self) -> list[dict]:
        """Manifests of the versions from ``base`` to the current one (the current lineage)."""
        chain, name = [], self.current_name
        while name != "base":
            manifest = json.loads((self.root / name / "manifest.json").read_text())
            chain.append(manifest)
            name = manifest["parent"]
        return chain[::-1]

    def applied_batches(self) -> set[str]:
        """Content hashes of the batches in the current lineage (a batch is never applied twice;
        one whose version was abandoned, e.g. by a rollback or a failed registration, may be)."""
        return {m.get("batch_sha256") for m in self.manifests()} - {None}

    def commit(self, retriever: DocIndex | IncDSIHead, manifest: dict, rejects: list[dict]) -> str:
        existing = sorted(p.name for p in self.root.glob("v[0-9]*"))
        name = f"v{int(existing[-1][1:]) + 1 if existing else 1:04d}"
        with atomic_path(self.root / name) as out:
            retriever.save(out)
            (out / "rejects.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rejects))
            manifest = {**manifest, "kind": self.kind, "version": name, "parent": self.current_name}
            (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
        with atomic_path(self.root / "CURRENT") as pointer:
            pointer.write_text(name + "\n")
        return name


def read_document_batch(path: Path) -> tuple[pd.DataFrame, list[dict]]:
    if not path.is_file():
        raise IngestError(f"{path}: no such batch file")
    rejects: list[dict] = []
    if path.suffix == ".jsonl":
        frame = read_jsonl_table(path, "corpus", CORPUS_FIELDS, required=("_id", "text"), rejects=rejects)
    elif path.suffix == ".parquet":
        frame = to_table(pd.read_parquet(path), "corpus", path.name)
    else:
        raise IngestError(f"{path}: batches are .jsonl or .parquet files")
    accepted, schema_rejects = validate_table(frame, corpus_schema(), "corpus")
    accepted["title"] = accepted["title"].fillna("")
    return accepted, rejects + schema_rejects


def _add_dense(index: DocIndex, documents: pd.DataFrame, encoder: Callable[[], Encoder], params: Params,
               embeddings: dict[str, np.ndarray] | None) -> dict:
    start = time.perf_counter()
    if embeddings is not None and all(d in embeddings for d in documents["doc_id"]):
        vectors = np.stack([embeddings[d] for d in documents["doc_id"]])  # encoded by the drift report
    else:
        vectors = encoder().encode(passage_texts(documents), params.encoder.max_passage_length, params.encoder.batch_size)
    encoded = time.perf_counter()
    index.add(np.asarray(vectors), documents["doc_id"].tolist())
    n = len(documents)
    return {"encode_ms_per_doc": 1000 * (encoded - start) / n, "add_ms_per_doc": 1000 * (time.perf_counter() - encoded) / n}


def _add_incdsi(head: IncDSIHead, documents: pd.DataFrame, encoder: Encoder, params: Params, layout: Layout,
                queries: pd.DataFrame | None) -> dict:
    if queries is None:
        queries = generate_queries(documents, params.querygen.generator,
                                   layout.root / ".cache" / "querygen" / "queries.parquet")
    addition, source = AdditionParams.for_head(layout.incdsi_head, params.incdsi)
    embeddings = None
    if addition.init == "document":  # the rows start from the documents' own embeddings
        embeddings = torch.from_numpy(encoder.encode(passage_texts(documents), params.encoder.max_passage_length,
                                                     params.encoder.batch_size))
    timings, not_separable = [], []
    for position, doc_id in enumerate(documents["doc_id"]):
        texts = queries.loc[queries["doc_id"] == doc_id, "query"].tolist()
        if not texts:  # every generated query was ambiguous: fall back to the document itself
            texts = documents.loc[documents["doc_id"] == doc_id, "text"].tolist()
        vectors = torch.from_numpy(encoder.encode(texts, params.encoder.max_query_length, params.encoder.batch_size))
        document = embeddings[position] if embeddings is not None else None
        result = head.add(doc_id, vectors, addition, document)  # times the optimisation only, as the paper
        timings.append(result.milliseconds)
        if not result.separable:
            not_separable.append(doc_id)
    return {
        "addition_params": {"source": source, **asdict(addition)},
        "add_ms_median": statistics.median(timings),
        "add_ms_p95": float(np.percentile(timings, 95)),
        "not_separable": not_separable,
    }


def add_documents(
    layout: Layout, params: Params, batch: Path, kind: str = "dense", embeddings: dict[str, np.ndarray] | None = None,
    queries: pd.DataFrame | None = None,
) -> dict:
    """Apply one batch file of new documents. Work already done upstream can be passed in:
    ``embeddings`` (doc id -> vector from the deployed encoder, e.g. the drift report's) spare
    the dense kind from encoding the documents again, ``queries`` (doc_id, query: the batch's
    generated queries) spare the incdsi kind from generating them again."""
    return _apply(layout, params, batch, kind, "add", embeddings, queries)


def edit_documents(layout: Layout, params: Params, batch: Path, kind: str = "dense") -> dict:
    """Replace indexed documents by the batch's new versions: dense re-encodes them; IncDSI
    re-optimises their rows from queries generated for the new text (remove, then add against
    the rest, as ``IncDSIHead.edit``)."""
    return _apply(layout, params, batch, kind, "edit", None, None)


def _apply(layout: Layout, params: Params, batch: Path, kind: str, operation: str,
           embeddings: dict[str, np.ndarray] | None, queries: pd.DataFrame | None) -> dict:
    start = time.perf_counter()
    versions = RetrieverVersions(layout, kind)
    digest = file_sha256(batch)
    if digest in versions.applied_batches():
        return {"status": "skipped", "reason": "batch already applied", "batch_sha256": digest}
    documents, rejects = read_document_batch(batch)
    retriever = versions.load()
    indexed = documents["doc_id"].isin(set(retriever.live_ids()))
    wrong = indexed if operation == "add" else ~indexed
    reason = "doc_id: already indexed (use edit-documents)" if operation == "add" else "doc_id: not indexed (use add-documents)"
    rejects += [reject_record("corpus", row, reason, "doc_id") for row in documents[wrong].to_dict("records")]
    documents = documents[~wrong].reset_index(drop=True)
    if operation == "add" and len(wrong) and wrong.all():  # e.g. a full retrain already included this batch
        return {"status": "skipped", "reason": "every document is already indexed", "batch_sha256": digest}
    if documents.empty:
        raise IngestError(f"{batch}: no valid documents to {operation} ({len(rejects)} rows rejected)")
    ids = documents["doc_id"].tolist()
    if operation == "edit":
        retriever.remove(ids) if kind == "dense" else retriever.remove_all(ids)
    encoder = functools.cache(lambda: Encoder(str(layout.encoder), params.encoder.pooling))
    if kind == "dense":
        timings = _add_dense(retriever, documents, encoder, params, embeddings)
    else:
        timings = _add_incdsi(retriever, documents, encoder(), params, layout, queries)
    manifest = {"operation": operation, "batch": str(batch), "batch_sha256": digest,
                ("added" if operation == "add" else "edited"): len(documents), "doc_ids": ids,
                "rejected": len(rejects), "documents": len(retriever.live_ids()), **timings}
    manifest["version"] = versions.commit(retriever, {**manifest, "total_ms": 1000 * (time.perf_counter() - start)},
                                          rejects)
    return manifest


def remove_documents(layout: Layout, doc_ids: list[str], kind: str = "dense") -> dict:
    versions = RetrieverVersions(layout, kind)
    retriever = versions.load()
    start = time.perf_counter()
    removed = retriever.remove(doc_ids) if kind == "dense" else retriever.remove_all(doc_ids)
    manifest = {"operation": "remove", "removed": removed, "doc_ids": doc_ids,
                "documents": len(retriever.live_ids()), "remove_ms": 1000 * (time.perf_counter() - start)}
    manifest["version"] = versions.commit(retriever, manifest, [])
    return manifest
