"""Model assets: corpus tree, trained encoder, FAISS index, IncDSI document-id head."""

import dagster as dg
import pandas as pd

from assets._common import artifact_metadata
from assets.data import corpus, pseudo_queries
from model_code.data.ingested import load_ingested
from model_code.stages import head, hierarchy, index, train
from orchestration.resources import ParamsResource, StageConfig, WorkspaceResource


@dg.asset(group_name="model", deps=[corpus], description="Corpus tree by recursive spherical k-means.")
def corpus_tree(config: StageConfig, params: ParamsResource, workspace: WorkspaceResource) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    layout = workspace.layout()
    stats = hierarchy.run(settings.hierarchy, settings.encoder, load_ingested(layout.ingested), layout)
    return dg.MaterializeResult(metadata=artifact_metadata(layout.hierarchy, stats))


@dg.asset(
    group_name="model",
    deps=[corpus, pseudo_queries, corpus_tree],
    description="Fine-tuned encoder (Hugging Face model directory).",
)
def encoder(
    context: dg.AssetExecutionContext, config: StageConfig, params: ParamsResource, workspace: WorkspaceResource
) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    layout = workspace.layout()
    pseudo = pd.read_parquet(layout.pseudo_queries)

    def on_step(step: int, values: dict[str, float]) -> None:
        if step % 10 == 0 or step == 1:
            context.log.info(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))

    summary = train.run(
        settings.train, settings.encoder, settings.hierarchy, load_ingested(layout.ingested), pseudo, layout, on_step
    )
    return dg.MaterializeResult(metadata=artifact_metadata(layout.encoder, summary))


@dg.asset(group_name="model", deps=[encoder], description="FAISS index over the corpus and its id map.")
def faiss_index(config: StageConfig, params: ParamsResource, workspace: WorkspaceResource) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    layout = workspace.layout()
    manifest = index.run(settings.index, settings.encoder, load_ingested(layout.ingested), layout)
    return dg.MaterializeResult(metadata=artifact_metadata(layout.index, manifest))


@dg.asset(group_name="model", deps=[encoder, pseudo_queries],
          description="IncDSI document-id head and its tuned addition parameters, built when freshness.retriever "
          "is incdsi (the head is what it serves; the dense index is kept for drift statistics).")
def incdsi_head(
    context: dg.AssetExecutionContext, config: StageConfig, params: ParamsResource, workspace: WorkspaceResource
) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    layout = workspace.layout()
    if settings.freshness.retriever != "incdsi":  # encoding every generated query costs minutes: only when served
        reason = "freshness.retriever is dense: no head needed (fresh-retriever build-head builds one on demand)"
        context.log.info(reason)
        return dg.MaterializeResult(metadata={"built": False, "reason": reason})
    manifest = head.run(settings, load_ingested(layout.ingested), layout)
    return dg.MaterializeResult(metadata={"built": True, **artifact_metadata(layout.incdsi_head, manifest)})
