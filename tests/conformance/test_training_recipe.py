"""A kind that trains its own way, defined in this file only (issue 44): its training recipe
(``Retriever.training_recipe``) is what the train stage runs, with its own objective settings,
saved output and report, and the kind then indexes, evaluates, registers, serves and takes an
update; the train stage's DVC dependencies and params follow from the registry, not from a list."""

import dataclasses
import json
from typing import ClassVar

import pytest

from model_code.config import load_params
from model_code.retrievers.dense import DenseRetriever
from model_code.retrievers.registry import register, unregister
from model_code.training.recipe import TrainingRecipe
from tests.conftest import run_stages, tiny_params
from tests.helpers.batches import write_batch

TEMPERATURE = 0.5


class HotRecipe(TrainingRecipe):
    """The dense encoder under the contrastive loss at a temperature of its own, contrastive only."""

    methods = ("contrastive",)
    temperatures: ClassVar[list[float]] = []  # each objective's temperature, as built

    def objective(self, inputs, trainer):
        objective = super().objective(dataclasses.replace(inputs, temperature=TEMPERATURE), trainer)
        HotRecipe.temperatures.append(objective.temperature)
        return objective

    def save(self, directory):
        super().save(directory)
        (directory / "hot.json").write_text(json.dumps({"temperature": TEMPERATURE}))

    def summary(self):
        return {"hot_temperature": TEMPERATURE}


class HotRetriever(DenseRetriever):
    kind = "hot"

    @classmethod
    def training_recipe(cls):
        return HotRecipe


@pytest.fixture
def hot_kind():
    register(HotRetriever)
    HotRecipe.temperatures.clear()
    yield HotRetriever
    unregister("hot")


def test_a_kind_with_its_own_training_runs_the_chain(tmp_path, beir_dir, tiny_model_dir, mlflow_uri, hot_kind):
    import mlflow

    from model_code.stages import train as train_stage
    from model_code.stages.pipeline import STAGES, code_files
    from model_code.versions.apply import upsert_documents
    from model_code.versions.chain import RetrieverVersions
    from tracking.registry import register as register_model

    params = tiny_params(beir_dir, tiny_model_dir, retriever={"kind": "hot"},
                         train={"data": "supervised", "method": "contrastive", "max_steps": 2, "dev_every": 0})
    layout = run_stages(tmp_path / "ws", params, "ingest", "querygen", "mine-negatives", "cluster", "train", "index",
                        "evaluate")
    assert HotRecipe.temperatures == [TEMPERATURE]  # the kind's objective trained the encoder
    assert json.loads((layout.encoder / "hot.json").read_text()) == {"temperature": TEMPERATURE}
    report = json.loads((layout.train_report / "metrics.json").read_text())
    assert report["hot_temperature"] == TEMPERATURE and report["steps"] == 2
    [train] = [stage for stage in STAGES if stage.name == "train"]
    assert "tests/conformance/test_training_recipe.py" in {str(p) for p in code_files(train)}  # DVC re-runs training on its change

    settings = load_params(layout.root / "params.yaml")
    with pytest.raises(ValueError, match=r"retriever.kind hot trains under train.method contrastive, not hce"):
        train_stage.run(load_params(layout.root / "params.yaml", {"train": {"method": "hce"}}), layout)
    assert register_model(settings, layout, tracking_uri=mlflow_uri)["alias"] == "champion"
    mlflow.set_tracking_uri(mlflow_uri)
    served = mlflow.pyfunc.load_model(f"models:/{settings.registry.model_name}@champion")
    assert isinstance(served.unwrap_python_model().retriever, HotRetriever)
    volcano = {"_id": "new-volcano", "title": "volcano", "text": "lava magma eruption crater ash plume"}
    manifest = upsert_documents(layout, settings, write_batch(tmp_path / "batch.jsonl", [volcano]))
    assert manifest["added"] == 1
    [hit] = RetrieverVersions(layout).load().search(["volcano lava magma eruption"], 1)
    assert hit.doc_ids == ["new-volcano"]
