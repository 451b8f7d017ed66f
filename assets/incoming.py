"""Incoming document batches: one dynamic partition per accepted inbox file.

ingest + validate (``incoming_batch``) -> generated queries (``batch_queries``) -> drift report
(``drift_report``, whose metadata carries the decision; the drift sensor reads it to launch a
retrain) -> ``champion_update`` (the batch added to the champion's retriever by its kind, a new
registered version), all in one run: a batch is served as soon as its report is written, whatever
the decision, except ``pending`` (no champion yet: the update is left out and the batch is
measured and applied again once one exists).
"""

import json
from collections.abc import Iterator

import dagster as dg
import pandas as pd

from assets._common import DEPLOYMENT_POOL
from model_code.data.generator import generate_queries
from model_code.data.ingested import load_ingested
from model_code.freshness import report
from model_code.freshness.deployment import NoChampionError, apply_batch, installed
from model_code.freshness.inbox import Inbox
from model_code.io import write_parquet
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
from tracking.deployment import MlflowRegistry, log_drift_report

incoming_batches = dg.DynamicPartitionsDefinition(name="incoming_batches")
# transient failures (a locked SQLite store, an artifact store hiccup) retry the step, with backoff;
# every step is idempotent (batch hashes, run keys, versioned outputs), so a retry never applies twice
INCOMING_ASSETS_RETRY = dg.RetryPolicy(max_retries=3, delay=10, backoff=dg.Backoff.EXPONENTIAL)


def _accepted(workspace: WorkspaceResource, batch_id: str):
    """The ledger's batch; a partition the ledger does not know fails at once (no retry can help)."""
    try:
        return Inbox(workspace.layout().inbox).batch(batch_id)
    except KeyError as exc:
        raise dg.Failure(str(exc), allow_retries=False) from None


def _batch_dir(workspace: WorkspaceResource, batch_id: str):
    return workspace.layout().incoming_batch(batch_id)


@dg.asset(group_name="incoming", partitions_def=incoming_batches, retry_policy=INCOMING_ASSETS_RETRY,
          description="An accepted inbox batch, validated with the ingestion schemas (rejects kept): "
          "documents added or replaced, and the ids it deletes.")
def incoming_batch(context: dg.AssetExecutionContext, params: ParamsResource,
                   workspace: WorkspaceResource) -> dg.MaterializeResult:
    batch = _accepted(workspace, context.partition_key)
    changes = Inbox(workspace.layout().inbox, data=params.load(workspace).data).read(batch)  # as it was accepted
    out = _batch_dir(workspace, batch.batch_id)
    write_parquet(out / "documents.parquet", changes.documents)
    (out / "rejects.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in changes.rejects))
    return dg.MaterializeResult(metadata={
        "file": batch.name, "sha256": batch.sha256, "documents": len(changes.documents),
        "deleted": len(changes.deleted), "rejected": len(changes.rejects),
        "path": dg.MetadataValue.path(str(out)),
    })


@dg.asset(group_name="incoming", partitions_def=incoming_batches, retry_policy=INCOMING_ASSETS_RETRY, deps=[incoming_batch],
          description="Generated queries for the batch's documents (cached by content hash).")
def batch_queries(context: dg.AssetExecutionContext, params: ParamsResource, workspace: WorkspaceResource) -> dg.MaterializeResult:
    settings = params.load(workspace)
    out = _batch_dir(workspace, context.partition_key)
    documents = pd.read_parquet(out / "documents.parquet")
    queries = generate_queries(documents, settings.querygen.generator,
                               workspace.layout().querygen_cache)
    write_parquet(out / "queries.parquet", queries)
    return dg.MaterializeResult(metadata={"queries": len(queries), "documents_with_queries": queries["doc_id"].nunique()})


@dg.asset(group_name="incoming", partitions_def=incoming_batches, retry_policy=INCOMING_ASSETS_RETRY, deps=[batch_queries],
          description="Drift of the batch against the champion's training snapshot, and the decision.")
def drift_report(
    context: dg.AssetExecutionContext, params: ParamsResource, workspace: WorkspaceResource, mlflow_store: MlflowResource
) -> dg.MaterializeResult:
    settings = params.load(workspace)
    layout = workspace.layout()
    registry = MlflowRegistry(settings, layout, mlflow_store.tracking_uri or None)
    out = layout.drift_reports / context.partition_key
    try:
        champion = registry.champion()  # read only: the report loads this version and moves no pointer
    except NoChampionError as exc:  # the batch waits; the drift sensor measures it again later
        result = report.pending(out, str(exc))
        return dg.MaterializeResult(metadata={"decision": result["decision"],
                                              "reasons": dg.MetadataValue.json(result["reasons"])})
    deployment = installed(registry, layout, champion)
    documents = pd.read_parquet(_batch_dir(workspace, context.partition_key) / "documents.parquet")
    result = report.run(settings, deployment, champion.retriever_version, load_ingested(layout.ingested), documents, out,
                        champion.encoder_fingerprint, frozenset(Inbox(layout.inbox).excluded()),
                        passage_text=champion.passage_text, batch_sha256=_accepted(workspace, context.partition_key).sha256)
    log_drift_report(settings, layout, context.partition_key, champion.version, result, mlflow_store.tracking_uri or None)
    stats = {k: dg.MetadataValue.float(float(v)) for k, v in result["statistics"].items()}
    return dg.MaterializeResult(metadata={
        "decision": result["decision"], "reasons": dg.MetadataValue.json(result["reasons"]),
        "champion_version": champion.version, "retriever_version": result["retriever_version"],
        "documents": result["documents"], **stats, "path": dg.MetadataValue.path(str(out)),
    })


@dg.asset(group_name="incoming", partitions_def=incoming_batches, retry_policy=INCOMING_ASSETS_RETRY,
          pool=DEPLOYMENT_POOL, deps=[drift_report], output_required=False,
          description="The batch added to the champion's retriever and registered as the new champion version "
          "(left out while the drift report is pending: there is no champion yet).")
def champion_update(
    context: dg.AssetExecutionContext, params: ParamsResource, workspace: WorkspaceResource, mlflow_store: MlflowResource
) -> Iterator[dg.MaterializeResult]:
    settings = params.load(workspace)
    layout = workspace.layout()
    batch = _accepted(workspace, context.partition_key)
    out = layout.drift_reports / context.partition_key
    measured = json.loads((out / "report.json").read_text())
    if measured["decision"] == report.PENDING:
        context.log.info(f"not applied: {'; '.join(measured['reasons'])}")
        return
    drift = measured["statistics"]
    queries = pd.read_parquet(_batch_dir(workspace, context.partition_key) / "queries.parquet")
    registry = MlflowRegistry(settings, layout, mlflow_store.tracking_uri or None)
    result = apply_batch(registry, settings, layout, batch.path, report.load_embeddings(out), drift, queries)
    if result.get("caught_up"):  # earlier batches the champion lacked, applied first (ledger order)
        context.log.info(f"applied first, in ledger order: {', '.join(result['caught_up'])}")
    context.log.info(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, default=str))
    yield dg.MaterializeResult(metadata={
        **{k: v for k, v in result.items() if isinstance(v, bool | int | float | str) and not k.endswith("sha256")},
        "caught_up": ", ".join(result.get("caught_up", [])),
        "decision": measured["decision"],  # "retrain": served now, a retrain was requested besides
    })
