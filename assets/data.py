"""Blocking quality checks of the ingested corpus (the ``corpus`` asset of ``assets.pipeline``)."""

import json

import dagster as dg

from model_code.data.ingested import load_ingested
from model_code.data.tables import RawDataset
from model_code.data.validation import validate_dataset
from orchestration.resources import ParamsResource, WorkspaceResource


@dg.asset_check(asset="corpus", blocking=True, description="great-expectations corpus suite passed.")
def corpus_expectations(workspace: WorkspaceResource) -> dg.AssetCheckResult:
    summary = json.loads((workspace.layout().ingest_report / "summary.json").read_text())
    failed = [e for e in summary["expectations"] if not e["success"]]
    return dg.AssetCheckResult(
        passed=summary["expectations_success"],
        metadata={"failed_expectations": dg.MetadataValue.json(failed), "documents": summary["documents"]},
    )


@dg.asset_check(asset="corpus", blocking=True, description="Written tables pass the pandera schemas (ids, qrels).")
def corpus_schema(params: ParamsResource, workspace: WorkspaceResource) -> dg.AssetCheckResult:
    data = load_ingested(workspace.layout().ingested)
    provenance = {"source": "ingested", "line": None}
    checked = validate_dataset(
        RawDataset(
            corpus=data.corpus.assign(**provenance),
            queries=data.queries.assign(**provenance),
            qrels={split: frame.assign(**provenance) for split, frame in data.qrels.items()},
        ),
        params.load(workspace).data,
    )
    return dg.AssetCheckResult(
        passed=not checked.rejects,
        metadata={"violations": len(checked.rejects), "examples": dg.MetadataValue.json(checked.rejects[:5])},
    )
