"""Sensors of the freshness loop. Each tick is cheap (sensors have a ~60 s budget): the heavy
work — encoding, drift statistics, updates, retraining — happens in the runs they launch.

* ``inbox_sensor``: sorts waiting inbox files (accepted / duplicate / quarantined), adds a dynamic
  partition per accepted batch and requests its ingest -> queries -> drift-report -> update run
  (every 2 s: most of a small batch's way to the endpoint is this wait and the run's start). Requests
  come from the inbox ledger, not from partition existence: every ledger batch whose
  ``incoming_batch`` partition is not materialised is requested on every tick, under the run key
  ``batch:<id>`` that Dagster never launches twice. A tick that died after adding the partition
  but before its run was saved is therefore repaired by the next one.
* ``drift_sensor``: reads the drift reports materialised since its cursor and, for a ``retrain``
  decision, launches a ``full_retrain`` (the batch itself is served at once by its own run's
  update, whatever the retrain's outcome); retrains coalesce: none is requested while one is
  queued and not started, or already requested in the tick, since a retrain ingests every accepted
  batch when it starts (one already running may have ingested before the batch arrived, so one
  more is queued behind it). Batches that arrived before any champion existed are reported ``pending`` (their run
  leaves the update out); once a champion exists their run goes again (run key
  ``recheck:<batch>:<champion version>``), so they are applied like any other. With no report to
  read and no update in flight, it requests an update for the oldest batch the champion does not
  serve that was applied once already (run key ``catchup:<batch>:<champion version>``): a promoted
  retrain gets the batches accepted after its ingest.
* ``failure_sensor``: records every failed run in the log and as a tagged MLflow run.
"""

from __future__ import annotations

import dagster as dg
import yaml

from assets.incoming import champion_update, drift_report, incoming_batch, incoming_batches
from model_code.freshness import report
from model_code.freshness.deployment import NoChampionError, served_batches
from model_code.freshness.inbox import Inbox
from orchestration.jobs import (
    DEPLOYMENT_TAG,
    PIPELINE_ASSET_NAMES,
    full_retrain,
    incremental_update,
    process_batch,
)
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
from tracking.deployment import MlflowRegistry, record_failure

RETRAIN_OVERRIDES = yaml.safe_dump({"data": {"include_incoming": True}}, default_flow_style=True).strip()
REPORTS_PER_TICK = 20
# a retrain that has not started yet will ingest every accepted batch; one already running may not
NOT_STARTED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
IN_FLIGHT = [*NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
CATCH_UP_TAG = "fresh/catch_up"  # <batch>:<champion version> of a catch-up update


@dg.sensor(job=process_batch, minimum_interval_seconds=2, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Accepts inbox files and starts one ingest/drift run per new batch.")
def inbox_sensor(context: dg.SensorEvaluationContext, params: ParamsResource, workspace: WorkspaceResource):
    inbox = Inbox(workspace.layout().inbox, data=params.load(workspace).data)
    outcome = inbox.receive()
    for name in outcome["quarantined"]:
        context.log.warning(f"{name} quarantined (see {inbox.quarantine_dir})")
    for name in outcome["duplicates"]:
        context.log.info(f"{name} was received before; moved to {inbox.duplicates_dir}, not applied again")
    ledger = [b.batch_id for b in inbox.batches()]
    known = set(context.instance.get_dynamic_partitions(incoming_batches.name))
    done = context.instance.get_materialized_partitions(incoming_batch.key)
    waiting = [b for b in ledger if b not in done]  # run keys make a re-request of a launched run a no-op
    latest = {record["batch_id"]: record for record in inbox.reverted()}  # a rollback asked to apply it again
    requeued = [dg.RunRequest(partition_key=b, run_key=f"requeue:{b}:{r['line']}", tags={"fresh/requeued": "true"})
                for b, r in latest.items() if r["status"] == "requeued"]
    if not waiting and not requeued:
        return dg.SkipReason(f"no new batch in {inbox.root} ({len(ledger)} received so far)")
    missing = [b for b in waiting if b not in known]
    return dg.SensorResult(
        run_requests=[dg.RunRequest(partition_key=b, run_key=f"batch:{b}") for b in waiting] + requeued,
        dynamic_partitions_requests=[incoming_batches.build_add_request(missing)] if missing else [],
    )


@dg.sensor(jobs=[incremental_update, full_retrain, process_batch], minimum_interval_seconds=5,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Reads new drift reports and launches a full retrain when one asks for it; runs pending "
           "batches again once a champion exists; catches a promoted retrain up on later batches.")
def drift_sensor(context: dg.SensorEvaluationContext, params: ParamsResource, workspace: WorkspaceResource,
                 mlflow_store: MlflowResource):
    after = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=drift_report.key, after_storage_id=after), limit=REPORTS_PER_TICK,
        ascending=True,
    ).records
    waiting, rechecks = _pending_rechecks(context.instance, params, workspace, mlflow_store)
    if not records:
        catch_up, stuck = _catch_up(context, params, workspace, mlflow_store)
        if rechecks or catch_up:
            return dg.SensorResult(run_requests=rechecks + catch_up)
        pending = f"; pending until a champion exists: {', '.join(waiting)}" if waiting else ""
        return dg.SkipReason(f"no drift report after storage id {after}{pending}{'; ' + stuck if stuck else ''}")
    requests, skipped = [], []
    retraining = any(_ingests_every_batch(r.dagster_run) for r in context.instance.get_run_records(
        dg.RunsFilter(job_name=full_retrain.name, statuses=NOT_STARTED)))
    for record in records:
        batch, report_id = record.partition_key, record.storage_id
        decision = record.asset_materialization.metadata["decision"].value
        tags = {"fresh/batch": batch, "fresh/decision": decision, "fresh/drift_report": str(report_id)}
        if decision != "retrain":  # served by its own run's update (pending: run again once a champion exists)
            skipped.append(f"{batch}: {decision}")
        elif retraining or requests:
            skipped.append(f"{batch}: a retrain is already queued (it will ingest every accepted batch)")
        else:
            config = {"ops": {name: {"config": {"overrides": RETRAIN_OVERRIDES}} for name in PIPELINE_ASSET_NAMES}}
            requests.append(dg.RunRequest(job_name=full_retrain.name, run_key=f"retrain:{batch}:{report_id}",
                                          run_config=config, tags=tags))
    context.log.info(f"{len(records)} drift report(s): {len(requests)} retrain(s) requested; not retraining for "
                     f"{skipped}")
    return dg.SensorResult(
        run_requests=rechecks + requests, cursor=str(records[-1].storage_id),
        skip_reason=None if rechecks or requests else f"no retrain asked for: {'; '.join(skipped)}",
    )


def _ingests_every_batch(run: dg.DagsterRun) -> bool:
    """Whether a queued retrain will ingest every batch accepted by then: one this sensor asked for (its
    config sets data.include_incoming), not a retry, which resumes after the steps that ran (its
    ingest among them): counting a retry dropped the retrain a later batch asked for."""
    ops = (run.run_config or {}).get("ops", {})
    asks = any(op.get("config", {}).get("overrides") == RETRAIN_OVERRIDES for op in ops.values())
    return asks and "dagster/parent_run_id" not in run.tags


def _catch_up(context: dg.SensorEvaluationContext, params: ParamsResource, workspace: WorkspaceResource,
              mlflow_store: MlflowResource) -> tuple[list[dg.RunRequest], str]:
    """An update for the oldest batch the champion does not serve that its own run applied once
    (``champion_update`` materialised; a failed one is the run retries' and the failure sensor's
    business), when no update is queued or running: after a retrain is promoted, the batches
    accepted after its ingest (applied to the old champion meanwhile, or not yet) are applied to
    it; its ``apply_batch`` also applies any later unserved one, in ledger order. A batch whose own
    run has not applied it yet waits for that run; when that run was cancelled or failed (retries
    spent) and no catch-up after it is asked for (whose ``apply_batch`` would apply it first), the
    reason to skip names it (a batch's run key makes Dagster drop a new request for it).
    One request per batch and champion version; when that one failed, the reason to skip says so
    (the batches after it wait: fix it, or exclude it)."""
    if any(context.instance.get_run_records(dg.RunsFilter(job_name=job.name, statuses=IN_FLIGHT), limit=1)
           for job in (incremental_update, process_batch)):
        return [], ""
    layout = workspace.layout()
    registry = MlflowRegistry(params.load(workspace), layout, mlflow_store.tracking_uri or None)
    try:
        champion = registry.champion()
    except NoChampionError:
        return [], ""
    served = served_batches(registry, champion)
    applied = context.instance.get_materialized_partitions(champion_update.key)
    unapplied = ""  # a batch whose own run stopped: said when no catch-up comes after it (one would apply it first)
    for batch in (b for b in Inbox(layout.inbox).included() if b.batch_id not in served):
        if batch.batch_id not in applied:  # its own run applies it; one cancelled or failed for good does not
            stopped = _stopped(context.instance, process_batch.name, {"dagster/partition": batch.batch_id})
            if stopped and not unapplied:
                unapplied = (f"the run of batch {batch.batch_id} {stopped}; the batch is not served: re-execute "
                             f"that run, or take the batch out with fresh-registry exclude-batches {batch.batch_id}")
            continue
        key = f"{batch.batch_id}:{champion.version}"
        # a cancelled one too: its run key makes Dagster drop every request again, so the batches after it would
        # wait without a word
        if stopped := _stopped(context.instance, None, {CATCH_UP_TAG: key}):
            return [], (f"the catch-up of batch {batch.batch_id} onto champion v{champion.version} {stopped}; the "
                        f"batches after it wait: fix it and re-execute that run, or take the batch out with "
                        f"fresh-registry exclude-batches {batch.batch_id}")
        return [dg.RunRequest(job_name=incremental_update.name, partition_key=batch.batch_id, run_key=f"catchup:{key}",
                              tags={"fresh/batch": batch.batch_id, CATCH_UP_TAG: key})], ""
    return [], unapplied


def _stopped(instance: dg.DagsterInstance, job_name: str | None, tags: dict[str, str]) -> str | None:
    """"failed (run <id>)" or "was cancelled (run <id>)" when the latest run of ``job_name`` with
    ``tags`` ended so, else None. Its run key makes Dagster drop a new request for it, so without
    this word the batch would wait for ever."""
    [latest] = instance.get_run_records(dg.RunsFilter(job_name=job_name, tags=tags), limit=1) or [None]
    if latest is None or latest.dagster_run.status not in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
        return None
    if latest.dagster_run.tags.get("dagster/will_retry") == "true":  # failed, its retry not created yet
        return None
    how = "was cancelled" if latest.dagster_run.status == dg.DagsterRunStatus.CANCELED else "failed"
    return f"{how} (run {latest.dagster_run.run_id})"


def _pending_rechecks(instance: dg.DagsterInstance, params: ParamsResource, workspace: WorkspaceResource,
                      mlflow_store: MlflowResource) -> tuple[list[str], list[dg.RunRequest]]:
    """The pending batches (excluded ones left out), and a drift-report run for each once a champion
    exists (none before) and none is queued or running for it: the one recheck per batch (a batch's
    report stays pending until its own run reaches it, and each new champion, such as the one the
    first recheck registers, made a new run key: N pending batches made N² runs)."""
    layout = workspace.layout()
    waiting = report.pending_batches(layout.drift_reports, [b.batch_id for b in Inbox(layout.inbox).included()])
    if not waiting:
        return [], []
    try:
        champion = MlflowRegistry(params.load(workspace), layout, mlflow_store.tracking_uri or None).champion()
    except NoChampionError:
        return waiting, []
    running = {r.dagster_run.tags.get("dagster/partition")
               for r in instance.get_run_records(dg.RunsFilter(job_name=process_batch.name, statuses=IN_FLIGHT))}
    return waiting, [dg.RunRequest(job_name=process_batch.name, partition_key=batch,
                                   run_key=f"recheck:{batch}:{champion.version}", tags={"fresh/batch": batch})
                     for batch in waiting if batch not in running]


@dg.run_failure_sensor(default_status=dg.DefaultSensorStatus.RUNNING,
                       description="Logs failed runs and records them as MLflow runs tagged kind=failure.")
def failure_sensor(context: dg.RunFailureSensorContext, params: ParamsResource, workspace: WorkspaceResource,
                   mlflow_store: MlflowResource):
    run = context.dagster_run
    error = context.failure_event.message or "unknown error"
    context.log.error(f"run {run.run_id} of {run.job_name} failed: {error}")
    tags = run.tags
    if tags.get(DEPLOYMENT_TAG) or run.job_name == process_batch.name:  # runs that may move the champion
        context.log.error("the previous champion and index version keep serving")
    record_failure(params.load(workspace), workspace.layout(), run.job_name, run.run_id, error,
                   mlflow_store.tracking_uri or None)
