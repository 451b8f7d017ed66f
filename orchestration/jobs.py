"""Jobs: the full pipeline, the per-batch ingest/drift run, and the two runs the drift sensor
launches. The runs that change what is deployed carry ``DEPLOYMENT_TAG``; ``dagster.yaml``
limits that tag to one run at a time, so batches are applied in arrival order, never interleaved."""

from __future__ import annotations

import dagster as dg

from assets import incoming
from assets.pipeline import PIPELINE_ASSETS

INCOMING_ASSETS = dg.load_assets_from_modules([incoming])
PIPELINE_ASSET_NAMES = [key.to_python_identifier() for a in PIPELINE_ASSETS for key in a.keys]
DEPLOYMENT_TAG = "fresh/deployment"

full_pipeline = dg.define_asset_job(
    "full_pipeline",
    selection=dg.AssetSelection.assets(*PIPELINE_ASSETS),
    description="Ingest -> query generation -> clustering -> training -> index -> evaluation -> registration.",
)

process_batch = dg.define_asset_job(
    "process_incoming_batch",
    selection=[incoming.incoming_batch, incoming.batch_queries, incoming.drift_report],
    partitions_def=incoming.incoming_batches,
    executor_def=dg.in_process_executor,  # small steps: a subprocess per step would cost more than the work
    description="One inbox batch: validate -> generated queries -> drift report (with the decision).",
)

incremental_update = dg.define_asset_job(
    "incremental_update",
    selection=[incoming.champion_update],
    partitions_def=incoming.incoming_batches,
    tags={DEPLOYMENT_TAG: "champion"},
    executor_def=dg.in_process_executor,
    description="Add the batch to the champion (encode-and-add; IncDSI rows for an IncDSI champion) and register "
    "it as the new champion.",
)

full_retrain = dg.define_asset_job(
    "full_retrain",
    selection=dg.AssetSelection.assets(*PIPELINE_ASSETS),
    tags={DEPLOYMENT_TAG: "champion"},
    description="The full pipeline on the merged corpus (source + every accepted batch); "
    "the result is registered as challenger unless it beats the champion.",
)
