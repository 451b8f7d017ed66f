"""Jobs: the full pipeline, the per-batch run (ingest, drift report, update), and the two runs the
drift sensor launches (a retrain; a catch-up update). The pipeline and the sensor-launched runs
carry ``DEPLOYMENT_TAG``, which ``dagster.yaml`` limits to one run at a time; every step that changes
the champion takes the deployment pool (one at a time), and ``apply_batch`` applies any earlier
unserved batch first, so batches are served in ledger order, never interleaved."""

from __future__ import annotations

import dagster as dg

from assets import incoming
from assets.pipeline import PIPELINE_ASSETS, SHARDED_ASSETS

INCOMING_ASSETS = dg.load_assets_from_modules([incoming])
PIPELINE_ASSET_NAMES = [key.to_python_identifier() for a in PIPELINE_ASSETS for key in a.keys]
DEPLOYMENT_TAG = "fresh/deployment"

# the pipeline's runs write one workspace (data/ingested, models/, reports/) and register what they built: a
# full_pipeline beside a full_retrain would register one's index under the other's ingest summary
full_pipeline = dg.define_asset_job(
    "full_pipeline",
    selection=dg.AssetSelection.assets(*PIPELINE_ASSETS),
    tags={DEPLOYMENT_TAG: "champion"},
    description="Ingest -> query generation -> clustering -> training -> index -> evaluation -> registration.",
)

encode_corpus = dg.define_asset_job(
    "encode_corpus",
    selection=dg.AssetSelection.assets(*SHARDED_ASSETS),
    partitions_def=SHARDED_ASSETS[0].partitions_def,
    description="The corpus encoded into the embedding cache, one run per shard (data.shards): backfill every "
    "partition to fan out (runs in parallel up to the run coordinator's limit), then materialize the index.",
)

# One run from an accepted file to the champion serving it: a run's start-up (a new process importing
# Dagster, torch and MLflow) is most of what a small batch costs, so the batch is not handed from a
# measuring run to an applying one. The update step takes the deployment pool (one such step at a
# time, whatever run holds it), not the run-level deployment tag: a batch is not held back behind a
# retrain's whole run, only behind its registration.
process_batch = dg.define_asset_job(
    "process_incoming_batch",
    selection=[incoming.incoming_batch, incoming.batch_queries, incoming.drift_report, incoming.champion_update],
    partitions_def=incoming.incoming_batches,
    executor_def=dg.in_process_executor,  # small steps: a subprocess per step would cost more than the work
    description="One inbox batch: validate -> generated queries -> drift report (with the decision) -> added to the "
    "champion and registered as the new champion (unless pending: no champion yet).",
)

incremental_update = dg.define_asset_job(
    "incremental_update",
    selection=[incoming.champion_update],
    partitions_def=incoming.incoming_batches,
    tags={DEPLOYMENT_TAG: "champion"},
    executor_def=dg.in_process_executor,
    description="Add a measured batch to the champion again (the drift sensor's catch-up after a promoted retrain, "
    "or by hand) and register it as the new champion.",
)

full_retrain = dg.define_asset_job(
    "full_retrain",
    selection=dg.AssetSelection.assets(*PIPELINE_ASSETS),
    tags={DEPLOYMENT_TAG: "champion"},
    description="The full pipeline on the merged corpus (source + every accepted batch); "
    "the result is registered as challenger unless it beats the champion.",
)
