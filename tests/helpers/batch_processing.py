"""What the freshness loop's runs do with an accepted batch, without Dagster: the kill tests run it
in child processes, which then import only the project's own modules (importing Dagster and the
test modules cost each child about 3 CPU-seconds more)."""

from pathlib import Path

from model_code.config import load_params
from model_code.freshness.deployment import apply_batch, installed
from model_code.layout import Layout
from tracking.deployment import MlflowRegistry


def process_batch(root: str, uri: str, batch_id: str) -> dict:
    """The batch's drift report (asset ``drift_report``), then its update (asset
    ``champion_update``), through the same functions."""
    from model_code.data.batches import read_document_batch
    from model_code.data.ingested import load_ingested
    from model_code.freshness import report
    from model_code.freshness.inbox import Inbox

    params, layout = load_params(Path(root) / "params.yaml"), Layout(root)
    registry = MlflowRegistry(params, layout, uri)
    batch = Inbox(layout.inbox).batch(batch_id)
    documents = read_document_batch(batch.path, params.data).documents
    champion, out = registry.champion(), layout.drift_reports / batch_id
    measured = report.run(params, installed(registry, layout, champion), champion.retriever_version,
                          load_ingested(layout.ingested), documents, out, champion.encoder_fingerprint,
                          passage_text=champion.passage_text, batch_sha256=batch.sha256)
    return apply_batch(registry, params, layout, batch.path, report.load_embeddings(out), measured["statistics"])
