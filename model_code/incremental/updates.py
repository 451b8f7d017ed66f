"""Apply document batches to the deployed dense index: validated, atomic, versioned.

Each successful batch writes a complete new index version under ``models/index_versions/vNNNN``
(faiss index, id map, manifest with timings) and only then moves the ``CURRENT`` pointer, with
``os.replace``. A batch is applied whole or not at all: a crash or a bad batch leaves ``CURRENT``
on the previous version, which stays loadable. Before the first update the pipeline's own index
(``models/index``) is the current version.

Batches are JSONL (BEIR corpus lines: ``_id``, ``title``, ``text``) or parquet, validated with the
ingestion schemas; rejected rows (bad fields, ids already indexed) go to the version's
``rejects.jsonl`` with their reason.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from model_code.config import EncoderParams
from model_code.data.beir import CORPUS_FIELDS, read_jsonl_table
from model_code.data.frames import to_table
from model_code.data.tables import IngestError, reject_record
from model_code.data.validation import corpus_schema, validate_table
from model_code.index.faiss_index import DocIndex
from model_code.io import atomic_path, file_sha256
from model_code.layout import Layout
from model_code.models.encoder import Encoder


class IndexVersions:
    def __init__(self, layout: Layout):
        self.layout = layout
        self.root = layout.root / "models" / "index_versions"

    @property
    def current_name(self) -> str:
        pointer = self.root / "CURRENT"
        return pointer.read_text().strip() if pointer.exists() else "base"

    def current_dir(self) -> Path:
        name = self.current_name
        return self.layout.index if name == "base" else self.root / name

    def applied_batches(self) -> set[str]:
        """Content hashes of every batch already applied (a batch is never applied twice)."""
        hashes = set()
        for manifest in self.root.glob("v*/manifest.json"):
            hashes.add(json.loads(manifest.read_text()).get("batch_sha256"))
        return hashes - {None}

    def commit(self, index: DocIndex, manifest: dict, rejects: list[dict]) -> str:
        existing = sorted(p.name for p in self.root.glob("v[0-9]*"))
        name = f"v{int(existing[-1][1:]) + 1 if existing else 1:04d}"
        with atomic_path(self.root / name) as out:
            index.save(out)
            (out / "rejects.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rejects))
            (out / "manifest.json").write_text(json.dumps({**manifest, "version": name, "parent": self.current_name}, indent=2))
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
    return accepted, rejects + schema_rejects


def add_documents(layout: Layout, encoder_params: EncoderParams, batch: Path) -> dict:
    versions = IndexVersions(layout)
    digest = file_sha256(batch)
    if digest in versions.applied_batches():
        return {"status": "skipped", "reason": "batch already applied", "batch_sha256": digest}
    documents, rejects = read_document_batch(batch)
    index = DocIndex.load(versions.current_dir())
    indexed = set(index.live_ids())
    clash = documents["doc_id"].isin(indexed)
    rejects += [reject_record("corpus", row, "doc_id: already indexed (use an edit)", "doc_id")
                for row in documents[clash].to_dict("records")]
    documents = documents[~clash]
    if documents.empty:
        raise IngestError(f"{batch}: no valid new documents ({len(rejects)} rows rejected)")
    encoder = Encoder(str(layout.encoder), encoder_params.pooling)
    passages = [f"{t}. {x}" if t else x for t, x in zip(documents["title"].fillna(""), documents["text"])]
    start = time.perf_counter()
    vectors = encoder.encode(passages, encoder_params.max_passage_length, encoder_params.batch_size)
    encoded = time.perf_counter()
    index.add(np.asarray(vectors), documents["doc_id"].tolist())
    added = time.perf_counter()
    manifest = {
        "operation": "add",
        "batch": str(batch),
        "batch_sha256": digest,
        "added": len(documents),
        "rejected": len(rejects),
        "documents": len(index),
        "encode_ms_per_doc": 1000 * (encoded - start) / len(documents),
        "add_ms_per_doc": 1000 * (added - encoded) / len(documents),
    }
    manifest["version"] = versions.commit(index, manifest, rejects)
    return manifest


def remove_documents(layout: Layout, doc_ids: list[str]) -> dict:
    versions = IndexVersions(layout)
    index = DocIndex.load(versions.current_dir())
    start = time.perf_counter()
    removed = index.remove(doc_ids)
    manifest = {"operation": "remove", "removed": removed, "doc_ids": doc_ids, "documents": len(index),
                "remove_ms": 1000 * (time.perf_counter() - start)}
    manifest["version"] = versions.commit(index, manifest, [])
    return manifest
