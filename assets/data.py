"""Data assets: the ingested corpus (with blocking quality checks) and the pseudo-queries."""

import json

import dagster as dg

from assets._common import artifact_metadata
from model_code.data.ingested import load_ingested
from model_code.data.tables import RawDataset
from model_code.data.validation import validate_dataset
from model_code.stages import ingest, querygen
from orchestration.resources import ParamsResource, StageConfig, WorkspaceResource


@dg.asset(group_name="data", description="Validated corpus, queries, qrels per split and the old/new/tune split.")
def corpus(config: StageConfig, params: ParamsResource, workspace: WorkspaceResource) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    layout = workspace.layout()
    summary = ingest.run(settings.data, layout)
    summary.pop("expectations")
    return dg.MaterializeResult(metadata=artifact_metadata(layout.ingested, summary))


@dg.asset_check(asset=corpus, blocking=True, description="great-expectations corpus suite passed.")
def corpus_expectations(workspace: WorkspaceResource) -> dg.AssetCheckResult:
    summary = json.loads((workspace.layout().ingest_report / "summary.json").read_text())
    failed = [e for e in summary["expectations"] if not e["success"]]
    return dg.AssetCheckResult(
        passed=summary["expectations_success"],
        metadata={"failed_expectations": dg.MetadataValue.json(failed), "documents": summary["documents"]},
    )


@dg.asset_check(asset=corpus, blocking=True, description="Written tables pass the pandera schemas (ids, qrels).")
def corpus_schema(workspace: WorkspaceResource) -> dg.AssetCheckResult:
    data = load_ingested(workspace.layout().ingested)
    provenance = {"source": "ingested", "line": None}
    checked = validate_dataset(
        RawDataset(
            corpus=data.corpus.assign(**provenance),
            queries=data.queries.assign(**provenance),
            qrels={split: frame.assign(**provenance) for split, frame in data.qrels.items()},
        )
    )
    return dg.AssetCheckResult(
        passed=not checked.rejects,
        metadata={"violations": len(checked.rejects), "examples": dg.MetadataValue.json(checked.rejects[:5])},
    )


@dg.asset(group_name="data", deps=[corpus], description="Inverse-cloze pseudo-queries for unsupervised training.")
def pseudo_queries(config: StageConfig, params: ParamsResource, workspace: WorkspaceResource) -> dg.MaterializeResult:
    settings = params.load(workspace, config.parsed())
    layout = workspace.layout()
    summary = querygen.run(settings.querygen, load_ingested(layout.ingested), layout)
    return dg.MaterializeResult(metadata=artifact_metadata(layout.pseudo_queries, summary))
