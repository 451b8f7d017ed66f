"""An incremental update is logged without MLflow loading the model: it takes its parent's
signature, the one the lineage's full training was logged with (derived from ``predict``'s type
hints and the input example, which MLflow ran then), so the endpoint can serve the update sooner.
The update must still take the params that signature declares (``k``)."""

import mlflow

from model_code.config import load_params
from model_code.freshness.deployment import apply_batch
from model_code.layout import Layout
from tests.helpers.batches import write_batch
from tests.helpers.deployment import IN_DOMAIN, MODEL, deploy
from tracking.deployment import MlflowRegistry
from tracking.pyfunc import RetrieverModel


def test_an_update_is_logged_with_its_parents_signature_and_no_model_load(tmp_path, tiny_model_dir, monkeypatch):
    root, uri, _ = deploy(tmp_path, tiny_model_dir, "dense")
    params, layout = load_params(root / "params.yaml"), Layout(root)
    registry = MlflowRegistry(params, layout, uri)
    loads, load_context = [], RetrieverModel.load_context

    def counted(self, context):
        loads.append(context)
        return load_context(self, context)

    monkeypatch.setattr(RetrieverModel, "load_context", counted)
    write_batch(tmp_path / "b1.jsonl", IN_DOMAIN)
    assert apply_batch(registry, params, layout, tmp_path / "b1.jsonl")["registered_version"] == 2
    assert loads == []  # MLflow ran no input example: the update's logging loaded nothing

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        full, update = (mlflow.models.get_model_info(f"models:/{MODEL}/{v}").signature for v in (1, 2))
        assert update.to_dict() == full.to_dict() and update.params.to_dict()[0]["name"] == "k"
        answer = mlflow.pyfunc.load_model(f"models:/{MODEL}/2").predict(
            ["comet crossing the nebula tracked by a telescope"], params={"k": 2})
    finally:
        mlflow.set_tracking_uri(previous)
    assert len(loads) == 1  # the load just above
    assert answer["doc_ids"][0] == answer["doc_ids"][0][:2] and len(answer["doc_ids"][0]) == 2  # k was taken
    assert answer["doc_ids"][0][0] == "astronomy-new"  # the update's document, served by v2
