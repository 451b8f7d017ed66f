"""The single Dagster ``Definitions`` object: assets, checks, jobs and resources."""

from __future__ import annotations

import dagster as dg

from assets import data, evaluation, model
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource

ALL_ASSETS = dg.load_assets_from_modules([data, model, evaluation])
ALL_CHECKS = dg.load_asset_checks_from_modules([data, model, evaluation])

full_pipeline_job = dg.define_asset_job(
    "full_pipeline",
    selection=dg.AssetSelection.groups("data", "model", "evaluation"),
    description="Ingest -> query generation -> clustering -> training -> index -> evaluation -> registration.",
)

defs = dg.Definitions(
    assets=ALL_ASSETS,
    asset_checks=ALL_CHECKS,
    jobs=[full_pipeline_job],
    resources={
        "params": ParamsResource(),
        "workspace": WorkspaceResource(),
        "mlflow_store": MlflowResource(),
    },
)
