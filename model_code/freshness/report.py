"""The drift-report stage: one incoming batch measured against the deployed retriever.

Runs in an asset, not in the sensor (sensors have a ~60 s budget): it embeds the batch into the
deployed retriever's vector space (``Retriever.vector_view``), computes the ``drift`` statistics
and the decision, and writes ``<out_dir>/report.json`` and ``embeddings.npz`` atomically. The
embeddings are reused by the incremental update so the documents are encoded once. A kind with no
dense vectors (bm25) is judged on document volume alone.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from model_code.config import Params
from model_code.data.ingested import IngestedData
from model_code.freshness.drift import (
    DriftReference,
    build_reference,
    decide,
    index_with,
    vector_statistics,
    volume_statistics,
)
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.retrievers import VectorView
from model_code.versions.chain import RetrieverVersions

log = logging.getLogger(__name__)
# How a document's title and text become the string its vector is made from
# (``model_code.data.ingested.passage_texts``), recorded on every registered version (tag
# ``passage_text``): a champion whose vectors were made from another form asks for a retrain, so
# that its lineage is not extended with vectors of this form for good. Versions registered before
# the tag are taken to read ``{title}. {text}``, the join before commit b3a6a66.
PASSAGE_TEXT = "{title} {text}"
UNRECORDED_PASSAGE_TEXT = "{title}. {text}"


def reference_dir(deployment: Layout) -> Path:
    return deployment.root / "drift_reference"


def load_reference(deployment: Layout, base: VectorView, params: Params, data: IngestedData) -> DriftReference:
    """The deployment's training-snapshot reference, built once and cached beside it."""
    directory = reference_dir(deployment)
    if (directory / "reference.json").is_file():
        return DriftReference.load(directory)
    reference = build_reference(base.index, base.embed_queries, data, params.hierarchy, params.freshness,
                                params.eval.ignore_identical_ids, params.registry.decision_split)
    reference.save(directory)
    log.info("drift reference: %d training documents, %d top-level clusters, %d canary queries",
             len(reference.base_ids), len(reference.centroids), len(reference.canary_qrels))
    return reference


def load_embeddings(out_dir: Path) -> tuple[dict[str, np.ndarray], str]:
    """The batch's document vectors and the fingerprint of the encoder that made them."""
    fingerprint = json.loads((out_dir / "report.json").read_text()).get("encoder_fingerprint", "")
    with np.load(out_dir / "embeddings.npz", allow_pickle=False) as arrays:
        return dict(zip(arrays["doc_ids"].tolist(), arrays["vectors"])), fingerprint


PENDING = "pending"  # the decision of a batch that arrived before any champion existed


def pending(out_dir: Path, reason: str) -> dict:
    """The report of a batch that cannot be measured yet (no champion): it waits, with the reason,
    and is measured again once a champion exists (``pending_batches``)."""
    report = {"decision": PENDING, "reasons": [reason], "documents": 0, "statistics": {}}
    with atomic_path(out_dir) as out:
        out.mkdir()
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log.info("drift report %s: pending (%s)", out_dir.name, reason)
    return report


def pending_batches(reports_dir: Path, arrival: list[str]) -> list[str]:
    """Batches whose latest report is pending, in ``arrival`` order (the ledger's)."""
    waiting = {p.parent.name for p in reports_dir.glob("*/report.json") if json.loads(p.read_text())["decision"] == PENDING}
    return [batch for batch in arrival if batch in waiting]


def in_flight_documents(out_dir: Path, deployment: Layout, applied: set[str], excluded: set[str]) -> int:
    """Documents of the other batches reported against this deployment whose update is queued or
    running (decided ``incremental`` or ``retrain``: both are applied incrementally), neither
    applied yet nor excluded by a rollback: they count toward the volume now, or two batches
    under the limit each would pass it together unnoticed. Pending reports (no champion yet) are
    not about this deployment."""
    count = 0
    for other in out_dir.parent.glob("*/report.json"):
        report = json.loads(other.read_text())
        batch_id = other.parent.name
        if (batch_id != out_dir.name and report["decision"] in ("incremental", "retrain")
                and report.get("deployment") == str(deployment.root)
                and not any(sha.startswith(batch_id) for sha in applied | excluded)):
            count += report["documents"]
    return count


def run(params: Params, deployment: Layout, version: str, data: IngestedData, documents: pd.DataFrame, out_dir: Path,
        fingerprint: str = "", excluded: frozenset[str] = frozenset(), *, passage_text: str,
        batch_sha256: str = "") -> dict:
    """Measure a validated batch (``documents``) against retriever ``version`` of the deployment
    (the champion's; read only, nothing is checked out); ``data`` (the ingested training data)
    supplies the canary queries. ``fingerprint`` names the encoder the batch's embeddings come
    from (saved with them, so an update made against another champion does not reuse them);
    ``excluded`` are the content hashes of batches a rollback excluded (never applied again);
    ``passage_text`` is the form the champion's documents were encoded from (its ``passage_text``
    tag; no default, so that no caller leaves the check out): another form than this code's is a
    reason to retrain, whatever the statistics say. A batch (content hash ``batch_sha256``) that
    ``version`` holds already, applied first by a later batch's update (ledger order), is measured
    against the version it was applied to, as it would have been on arrival: against ``version``
    its documents are indexed, nothing is new, and its drift was never measured."""
    start = time.perf_counter()
    versions = RetrieverVersions(deployment)
    applied = next((m for m in versions.manifests(version) if m.get("batch_sha256") == batch_sha256),
                   None) if batch_sha256 else None
    version = applied["parent"] if applied else version
    retriever = versions.load_version(version)
    indexed = set(retriever.live_ids())
    documents = documents[~documents["doc_id"].isin(indexed)]
    doc_ids = documents["doc_id"].tolist()
    view = retriever.vector_view()
    vectors = view.embed_documents(documents) if view is not None and doc_ids else np.empty((0, 0), np.float32)

    if not doc_ids:
        stats, action, reasons = {}, "none", [("no new document in the batch (its edits and deletions are applied "
                                              "without a drift check)")]
    else:
        base = versions.load_version("base")
        base_ids = base.live_ids()
        added = sorted(indexed - set(base_ids))
        waiting = in_flight_documents(out_dir, deployment, versions.applied_batches(version), excluded)
        stats = volume_statistics(len(doc_ids), len(added) + waiting + len(doc_ids), len(base_ids))
        stats["in_flight_documents"] = waiting
        if view is not None:
            reference = load_reference(deployment, base.vector_view(), params, data)
            cumulative = np.concatenate([view.index.vectors(added), vectors]) if added else vectors
            stats.update(vector_statistics(reference, vectors, cumulative, index_with(view.index, vectors, doc_ids)))
        stats.update(type(retriever).update_health(versions.manifests(version)))
        action, reasons = decide(stats, params.freshness.thresholds, params.freshness.min_batch_documents)
    if passage_text != PASSAGE_TEXT and type(retriever).uses_encoder:
        reason = (f"the champion's passage text is {passage_text!r} (a version registered before versions recorded "
                  f"it is taken as {UNRECORDED_PASSAGE_TEXT!r}), this code encodes {PASSAGE_TEXT!r}: retrain so "
                  "every vector is made one way")
        action, reasons = "retrain", [*reasons, reason]
    report = {
        "deployment": str(deployment.root), "retriever_version": version, "encoder_fingerprint": fingerprint,
        "documents": len(doc_ids), "decision": action, "reasons": reasons,
        "statistics": stats, "seconds": time.perf_counter() - start,
    }
    with atomic_path(out_dir) as out:
        out.mkdir()
        np.savez(out / "embeddings.npz", doc_ids=np.array(doc_ids if len(vectors) else [], dtype=str), vectors=vectors)
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    log.info("drift report %s: %s %s", out_dir.name, action, "; ".join(reasons))
    return report
