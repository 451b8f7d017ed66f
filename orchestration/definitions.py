"""The single Dagster ``Definitions`` object: assets, checks, jobs, sensors, the schedule and resources."""

from __future__ import annotations

import dagster as dg

from assets import data, incoming
from orchestration import jobs, maintenance, sensors
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource

ALL_ASSETS = [*jobs.PIPELINE_ASSETS, *jobs.SHARDED_ASSETS, *jobs.INCOMING_ASSETS]
ALL_CHECKS = dg.load_asset_checks_from_modules([data, incoming])



def definitions(executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """The Definitions; ``executor`` runs the jobs that name none (local: Dagster's multiprocess
    default; Kubernetes: ``orchestration/k8s/definitions.py``'s pod per step)."""
    return dg.Definitions(
        assets=ALL_ASSETS,
        asset_checks=ALL_CHECKS,
        jobs=[jobs.full_pipeline, jobs.encode_corpus, jobs.process_batch, jobs.incremental_update, jobs.full_retrain,
              maintenance.milvus_gc],
        sensors=[sensors.inbox_sensor, sensors.drift_sensor, sensors.failure_sensor],
        schedules=[maintenance.milvus_gc_schedule],
        resources={
            "params": ParamsResource(),
            "workspace": WorkspaceResource(),
            "mlflow_store": MlflowResource(),
        },
        executor=executor,
    )


defs = definitions()
