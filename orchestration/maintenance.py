"""The daily Milvus garbage collection: ``fresh-registry gc --apply`` as a Dagster job on a schedule.

Why scheduled: on ``index.backend: milvus`` every update leaves rows that a later version may no
longer list, and a commit row that every following server polls (``model_code/stores/milvus_commits.py``).
Nobody has to remember ``gc`` for the commit log to stay about a grace period (24 h) of updates
long and the collections to lose what no registered version can serve again. The schedule skips
its ticks while the params name another backend, so a deployment on files never sees a run of it.
"""

import dagster as dg

from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
from tracking.collections import collect_garbage

GC_CRON = "17 3 * * *"  # daily at 03:17 UTC, an hour that is rarely anyone's busiest


class GarbageConfig(dg.Config):
    """How old unreferenced things must be before they go (``fresh-registry gc --grace-hours``)."""

    grace_hours: float = 24.0


@dg.op(description="Drop the Milvus collections, write-set rows and settled commit rows no version needs any more")
def collect_milvus_garbage(context: dg.OpExecutionContext, config: GarbageConfig, params: ParamsResource,
                           workspace: WorkspaceResource, mlflow_store: MlflowResource) -> dict:
    report = collect_garbage(params.load(workspace), workspace.layout(), config.grace_hours * 3600, apply=True,
                             tracking_uri=mlflow_store.tracking_uri or None)
    context.add_output_metadata({"collections_dropped": sum(len(r["collections_dropped"]) for r in report["by_uri"].values()),
                                 "rows_deleted": sum(r["rows_deleted"] for r in report["by_uri"].values()),
                                 "commit_rows_trimmed": sum(report["commit_rows_trimmed"].values())})
    return report


@dg.job(description="fresh-registry gc --apply: what no registered version, no current version and no commit needs")
def milvus_gc():
    collect_milvus_garbage()


@dg.schedule(job=milvus_gc, cron_schedule=GC_CRON, execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.RUNNING)
def milvus_gc_schedule(context: dg.ScheduleEvaluationContext, params: ParamsResource, workspace: WorkspaceResource):
    backend = params.load(workspace).index.backend
    if backend != "milvus":
        return dg.SkipReason(f"index.backend is {backend}: nothing kept in Milvus to collect")
    return dg.RunRequest()
