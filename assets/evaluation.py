"""Evaluation and registration assets."""

import dagster as dg

from assets._common import artifact_metadata
from assets.model import faiss_index, incdsi_head
from model_code.data.ingested import load_ingested
from model_code.stages import evaluate
from orchestration.resources import MlflowResource, ParamsResource, StageConfig, WorkspaceResource
from tracking.registry import register


@dg.asset(group_name="evaluation", deps=[faiss_index, incdsi_head],
          description="Test-split retrieval metrics (ranx) of the retriever freshness.retriever deploys.")
def evaluation(config: StageConfig, params: ParamsResource, workspace: WorkspaceResource) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    layout = workspace.layout()
    metrics = evaluate.run(settings.eval, settings.encoder, load_ingested(layout.ingested), layout,
                           settings.freshness.retriever)
    table = "| metric | value |\n|---|---|\n" + "\n".join(f"| {m} | {metrics[m]:.4f} |" for m in settings.eval.metrics)
    return dg.MaterializeResult(
        metadata={**artifact_metadata(layout.eval_report, metrics), "metrics": dg.MetadataValue.md(table)}
    )


@dg.asset(group_name="evaluation", deps=[evaluation], description="MLflow run + registered pyfunc retriever.")
def registered_model(
    context: dg.AssetExecutionContext,
    config: StageConfig,
    params: ParamsResource,
    workspace: WorkspaceResource,
    mlflow_store: MlflowResource,
) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    result = register(settings, workspace.layout(), mlflow_store.tracking_uri or None, run_name=context.run_id)
    return dg.MaterializeResult(metadata={k: v for k, v in result.items() if v is not None})
