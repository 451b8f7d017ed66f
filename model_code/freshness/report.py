"""The drift-report stage: one incoming batch measured against the deployed retriever.

Runs in an asset, not in the sensor (sensors have a ~60 s budget): it encodes the batch with the
deployed encoder, computes ``drift.drift_statistics`` and the decision, and writes
``<out_dir>/report.json`` and ``embeddings.npz`` atomically. The embeddings are reused by the
incremental update so the documents are encoded once.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from model_code.config import Params
from model_code.data.ingested import IngestedData, passage_texts
from model_code.freshness.drift import DriftReference, build_reference, decide, drift_statistics, index_with
from model_code.incremental.updates import RetrieverVersions
from model_code.index.faiss_index import DocIndex
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.encoder import Encoder

log = logging.getLogger(__name__)


def reference_dir(deployment: Layout) -> Path:
    return deployment.root / "drift_reference"


def load_reference(deployment: Layout, encoder: Encoder, params: Params, data: IngestedData) -> DriftReference:
    """The deployment's training-snapshot reference, built once and cached beside it."""
    directory = reference_dir(deployment)
    if (directory / "reference.json").is_file():
        return DriftReference.load(directory)
    base = RetrieverVersions(deployment, "dense").base
    reference = build_reference(
        DocIndex.load(base),
        lambda texts: encoder.encode(texts, params.encoder.max_query_length, params.encoder.batch_size),
        data, params.hierarchy, params.freshness,
    )
    reference.save(directory)
    log.info("drift reference: %d training documents, %d top-level clusters, %d canary queries",
             len(reference.base_ids), len(reference.centroids), len(reference.canary_qrels))
    return reference


def load_embeddings(out_dir: Path) -> dict[str, np.ndarray]:
    with np.load(out_dir / "embeddings.npz", allow_pickle=False) as arrays:
        return dict(zip(arrays["doc_ids"].tolist(), arrays["vectors"]))


def run(params: Params, deployment: Layout, data: IngestedData, documents: pd.DataFrame, out_dir: Path,
        kind: str = "dense") -> dict:
    """Measure a validated batch (``documents``) against the deployment's current index version;
    ``data`` (the ingested training data) supplies the canary queries; ``kind`` is the deployed
    retriever (an IncDSI deployment's unseparable additions count toward the decision)."""
    start = time.perf_counter()
    dense = RetrieverVersions(deployment, "dense")
    index = dense.load()
    indexed = set(index.live_ids())
    encoder = Encoder(str(deployment.encoder), params.encoder.pooling)
    reference = load_reference(deployment, encoder, params, data)

    documents = documents[~documents["doc_id"].isin(indexed)]
    vectors = encoder.encode(passage_texts(documents), params.encoder.max_passage_length, params.encoder.batch_size)
    doc_ids = documents["doc_id"].tolist()

    if doc_ids:
        added = sorted(indexed - set(reference.base_ids))
        cumulative = np.concatenate([index.vectors(added), vectors]) if added else vectors
        manifests = RetrieverVersions(deployment, kind).manifests()
        incdsi = [m for m in manifests if m.get("operation") == "add" and "not_separable" in m]
        stats = drift_statistics(
            reference, vectors, cumulative, index_with(index, vectors, doc_ids),
            unseparable=sum(len(m["not_separable"]) for m in incdsi), incdsi_added=sum(m["added"] for m in incdsi),
        )
        action, reasons = decide(stats, params.freshness.thresholds, params.freshness.min_batch_documents)
    else:
        stats, action, reasons = {}, "none", ["no new document in the batch (all rejected or already indexed)"]
    report = {
        "deployment": str(deployment.root), "index_version": dense.current_name,
        "documents": len(doc_ids), "decision": action, "reasons": reasons,
        "statistics": stats, "seconds": time.perf_counter() - start,
    }
    with atomic_path(out_dir) as out:
        out.mkdir()
        np.savez(out / "embeddings.npz", doc_ids=np.array(doc_ids, dtype=str), vectors=vectors)
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    log.info("drift report %s: %s %s", out_dir.name, action, "; ".join(reasons))
    return report
