"""The freshness loop end to end on tiny data with the real MiniLM encoder (no fine-tuning):
inbox sensor -> per-batch ingest/drift run -> drift sensor -> incremental update or full retrain,
against a real Dagster instance, a real MLflow store and the served pyfunc."""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient

from assets.incoming import batch_queries, champion_update, drift_report, incoming_batch
from model_code.config import load_params
from model_code.freshness.deployment import apply_batch, checkout, rollback
from model_code.layout import Layout
from model_code.versions.chain import RetrieverVersions
from orchestration.definitions import ALL_CHECKS
from orchestration.jobs import PIPELINE_ASSETS
from orchestration.sensors import drift_sensor, failure_sensor
from tests.helpers.batches import write_batch
from tests.helpers.deployment import BATCH_RUN, IN_DOMAIN, MODEL, deploy, receive, served_champion, tick
from tracking.deployment import MlflowRegistry


@pytest.fixture
def deployed(tmp_path, tiny_model_dir):
    """A workspace whose zero-shot MiniLM dense retriever is the registered champion (v1)."""
    return deploy(tmp_path, tiny_model_dir, "dense")


def champion_version(uri) -> int:
    return int(MlflowClient(tracking_uri=uri).get_model_version_by_alias(MODEL, "champion").version)


def gibberish(n: int) -> list[dict]:
    rng = np.random.default_rng(5)
    letters = np.array(list("bcdfghjklmnpqrstvwxz"))
    word = lambda: "".join(rng.choice(letters, size=rng.integers(4, 9)))
    return [{"_id": f"noise-{i}", "title": word(), "text": " ".join(word() for _ in range(30))} for i in range(n)]


def assert_the_update_references_its_lineage_encoder(uri: str, update: str, root: str) -> None:
    """The first incremental version stores what its update changed in the retriever, a reference
    to the full training's retriever it applies to, and one to the encoder that training logged:
    no copy of the weights or of the index."""
    client = MlflowClient(tracking_uri=uri)

    def stored(version: str) -> Path:
        return Path(client.get_model_version_download_uri(MODEL, version).removeprefix("file://"))

    update_dir, root_dir = stored(update), stored(root)
    artifacts = mlflow.models.Model.load(str(update_dir)).flavors["python_function"]["artifacts"]
    assert sorted(artifacts) == ["encoder_ref", "retriever", "retriever_chain", "serve"]
    reference = json.loads((update_dir / "artifacts" / "encoder_ref.json").read_text())["encoder_uri"]
    assert Path(reference.removeprefix("file://")) == root_dir / "artifacts" / "encoder"
    [base] = json.loads((update_dir / "artifacts" / "retriever_chain.json").read_text())["bases"]
    assert Path(base.removeprefix("file://")) == root_dir / "artifacts" / "retriever"
    delta = update_dir / artifacts["retriever"]["path"]
    assert json.loads((delta / "manifest.json").read_text())["delta_of"] == "base"
    size = lambda d: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size(update_dir) < size(root_dir / "artifacts" / "encoder") / 4
    assert size(delta) < size(root_dir / "artifacts" / "retriever") / 4


def test_a_champion_encoded_from_another_passage_text_is_served_the_batch_and_retrained(deployed):
    """A champion registered before versions recorded their passage text (its documents encoded as
    ``title. text``): the batch is served at once, as any batch decided ``retrain``, the update keeps
    the lineage's form, and the drift sensor asks for the retrain that encodes every document one way."""
    from model_code.freshness.report import PASSAGE_TEXT, UNRECORDED_PASSAGE_TEXT

    root, uri, resources = deployed
    client = MlflowClient(tracking_uri=uri)
    assert client.get_model_version(MODEL, "1").tags["passage_text"] == PASSAGE_TEXT  # what a registration records
    client.delete_model_version_tag(MODEL, "1", "passage_text")  # as registered before the tag
    with dg.instance_for_test() as instance:
        write_batch(root / "inbox" / "b1.jsonl", IN_DOMAIN)
        [key] = receive(instance, resources)
        assert dg.materialize(BATCH_RUN, partition_key=key, instance=instance, resources=resources).success
        report = json.loads((root / "reports" / "drift" / key / "report.json").read_text())
        assert report["decision"] == "retrain"
        [reason] = report["reasons"]  # the in-domain batch trips no statistic (the loop test's first batch)
        assert repr(UNRECORDED_PASSAGE_TEXT) in reason and repr(PASSAGE_TEXT) in reason
        assert champion_version(uri) == 2  # served now
        assert client.get_model_version(MODEL, "2").tags["passage_text"] == UNRECORDED_PASSAGE_TEXT
        [retrain] = tick(drift_sensor, instance, resources).run_requests
        assert retrain.job_name == "full_retrain" and retrain.run_key.startswith(f"retrain:{key}:")


def test_freshness_loop_end_to_end(deployed):
    root, uri, resources = deployed
    inbox = root / "inbox"
    with dg.instance_for_test() as instance:
        assert isinstance(tick(drift_sensor, instance, resources), dg.SkipReason)  # first tick: no report yet
        assert receive(instance, resources) == []  # nothing in the inbox

        # an in-distribution batch, plus a malformed file that must not block it
        write_batch(inbox / "b1.jsonl", IN_DOMAIN)
        (inbox / "broken.jsonl").write_text("{oops\n")
        os.utime(inbox / "broken.jsonl", (time.time() - 10, time.time() - 10))
        [first] = receive(instance, resources)
        assert (inbox / "quarantine" / "broken.jsonl.error.json").exists()
        # one run from the file to the champion: validate, queries, drift report, update
        assert dg.materialize(BATCH_RUN, partition_key=first, instance=instance, resources=resources).success
        report = json.loads((root / "reports" / "drift" / first / "report.json").read_text())
        assert report["decision"] == "incremental", report["reasons"]
        assert champion_version(uri) == 2
        result = tick(drift_sensor, instance, resources)  # nothing left for the drift sensor: no retrain asked for
        assert result.run_requests == [] and "no retrain asked for" in result.skip_reason.skip_message
        mlflow.set_tracking_uri(uri)
        served = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
        hits = served.predict(["comet crossing the nebula tracked by a telescope"], params={"k": 3})
        assert hits["doc_ids"][0][0] == "astronomy-new"
        assert_the_update_references_its_lineage_encoder(uri, "2", "1")

        # the same content again (another name) is never applied twice
        write_batch(inbox / "b1-again.jsonl", IN_DOMAIN)
        assert receive(instance, resources) == []
        assert (inbox / "duplicates" / "b1-again.jsonl").exists()

        # two batches from another "domain" (random letter strings) drift past the thresholds
        noise = gibberish(12)
        write_batch(inbox / "noise-1.jsonl", noise[:6])
        write_batch(inbox / "noise-2.jsonl", noise[6:])
        first_noise, second_noise = receive(instance, resources)
        for key in (first_noise, second_noise):
            outcome = dg.materialize(BATCH_RUN, partition_key=key, instance=instance, resources=resources)
            report = json.loads((root / "reports" / "drift" / key / "report.json").read_text())
            assert report["decision"] == "retrain"
            assert any(r.startswith(("batch_similarity_ks", "cumulative_similarity_ks")) for r in report["reasons"])
            [update] = outcome.asset_materializations_for_node("champion_update")  # served now, never stranded
            assert update.metadata["decision"].value == "retrain"
        assert champion_version(uri) == 4
        [retrain] = tick(drift_sensor, instance, resources, cursor=result.cursor).run_requests  # one: they coalesce
        assert retrain.job_name == "full_retrain" and retrain.run_key.startswith(f"retrain:{first_noise}:")

        # the retrain trains on the merged corpus; it does not beat the champion by the margin
        outcome = dg.materialize([*PIPELINE_ASSETS, *ALL_CHECKS], run_config=retrain.run_config,
                                 instance=instance, resources=resources)
        assert outcome.success
        summary = json.loads((root / "reports" / "ingest" / "summary.json").read_text())
        assert summary["documents"] == 48 + 2 + 12
        registration = json.loads((root / "reports" / "registry" / "registration.json").read_text())
        assert registration["alias"] == "challenger" and "does not beat champion" in registration["reason"]
        assert champion_version(uri) == 4

        # the served champion answers over HTTP with the incrementally added document
        with open(root / "serve.log", "w") as log_file, served_champion(uri, log_file) as post:
            status, body = post({"inputs": ["cooking sourdough bread in a hot oven"], "params": {"k": 3}})
            assert status == 200 and json.loads(body)["predictions"][0]["doc_ids"][0] == "cooking-new"
            assert_the_endpoint_answers_bad_requests_with_400(post, root)


def test_failure_sensor_records_failed_runs(deployed):
    _, uri, resources = deployed
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("incoming_batches", ["missing"])
        result = dg.materialize([champion_update], partition_key="missing", instance=instance, resources=resources,
                                raise_on_error=False)
        assert not result.success
        run = instance.get_run_by_id(result.run_id)
        failure = next(e for e in instance.all_logs(result.run_id) if e.dagster_event and e.dagster_event.is_run_failure)
        context = dg.build_run_status_sensor_context(
            sensor_name="failure_sensor", dagster_instance=instance, dagster_run=run, dagster_event=failure.dagster_event,
            resources=resources,
        ).for_run_failure()
        failure_sensor(context)
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("test").experiment_id], "tags.kind = 'failure'")
    assert len(runs) == 1 and runs[0].data.tags["dagster_run_id"] == result.run_id
    assert champion_version(uri) == 1  # the failed update changed nothing


def assert_the_endpoint_answers_bad_requests_with_400(post, root: Path) -> None:
    """Each bad request: HTTP 400 whose body names the field and carries no stack trace or local
    path; a 1 MB query is cut at the encoder's length and answered."""
    bad = [({"inputs": []}, "inputs"), ({"inputs": [""]}, "inputs[0]"),
           ({"inputs": ["ok", 42]}, "Expected type str, but got int"),  # MLflow's type-hint check, never "42"
           ({"inputs": ["ok"], "params": {"k": -1}}, "params.k"),
           ({"inputs": ["ok"], "params": {"k": 100_000_000}}, "params.k"),
           ({"inputs": ["q"] * 10_000}, "serve.max_queries")]
    for payload, field in bad:
        status, body = post(payload)
        assert status == 400 and field in body, (str(payload)[:80], status, body[:500])
        assert "Traceback" not in body and "stack_trace" not in body and str(root) not in body
        assert "site-packages" not in body, body[:500]
    status, body = post({"inputs": ["lava " * 200_000], "params": {"k": 2}})
    assert status == 200 and len(json.loads(body)["predictions"][0]["doc_ids"]) == 2


def test_concurrent_batches_are_applied_one_after_the_other_and_rollback(deployed, tmp_path):
    root, uri, _ = deployed
    params, layout = load_params(root / "params.yaml"), Layout(root)
    batches = [write_batch(tmp_path / f"{doc['_id']}.jsonl", [doc]) for doc in IN_DOMAIN]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda batch: apply_batch(MlflowRegistry(params, layout, uri), params, layout, batch), batches))
    assert sorted(r["registered_version"] for r in results) == [2, 3]
    assert champion_version(uri) == 3
    deployment, _ = checkout(MlflowRegistry(params, layout, uri), layout)
    versions = RetrieverVersions(deployment)
    chain = versions.manifests()
    assert [m["version"] for m in chain] == ["v0001", "v0002"] and chain[1]["parent"] == "v0001"
    assert {"astronomy-new", "cooking-new"} <= set(versions.load().live_ids())  # neither update was lost

    mlflow.set_tracking_uri(uri)
    assert rollback(MlflowRegistry(params, layout, uri), layout)["to_version"] == 2  # one update back
    deployment, current = checkout(MlflowRegistry(params, layout, uri), layout)
    assert versions.current_name == current.tags["retriever_version"] == "v0001"
    assert len(set(versions.load().live_ids()) & {"astronomy-new", "cooking-new"}) == 1


def test_a_failed_registration_leaves_the_champion_and_the_batch_can_be_retried(deployed, tmp_path, monkeypatch):
    root, uri, _ = deployed
    params, layout = load_params(root / "params.yaml"), Layout(root)
    batch = write_batch(tmp_path / "b.jsonl", IN_DOMAIN[:1])

    def unavailable(*args, **kwargs):
        raise ConnectionError("artifact store unavailable")

    monkeypatch.setattr("tracking.deployment.log_retriever", unavailable)
    with pytest.raises(ConnectionError):
        apply_batch(MlflowRegistry(params, layout, uri), params, layout, batch)
    assert champion_version(uri) == 1
    deployment, _ = checkout(MlflowRegistry(params, layout, uri), layout)
    assert RetrieverVersions(deployment).current_name == "base"  # the orphan version is not served
    monkeypatch.undo()
    assert apply_batch(MlflowRegistry(params, layout, uri), params, layout, batch)["registered_version"] == 2


def test_an_incdsi_champion_is_updated_by_incdsi_and_serves_the_new_documents(tmp_path, tiny_model_dir):
    root, uri, resources = deploy(tmp_path, tiny_model_dir, "incdsi")
    params, layout = load_params(root / "params.yaml"), Layout(root)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_model_version_by_alias(MODEL, "champion").tags["retriever"] == "incdsi"
    write_batch(root / "inbox" / "b1.jsonl", IN_DOMAIN)
    with dg.instance_for_test() as instance:
        [batch] = receive(instance, resources)
        assert dg.materialize([incoming_batch, batch_queries, drift_report, champion_update], partition_key=batch,
                              instance=instance, resources=resources).success
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert int(champion.version) == 2
    assert (champion.tags["retriever"], champion.tags["retriever_version"]) == ("incdsi", "v0001")
    deployment, _ = checkout(MlflowRegistry(params, layout, uri), layout)
    head_versions = RetrieverVersions(deployment)
    manifest = head_versions.manifests()[-1]
    assert manifest["added"] == 2 and manifest["add_ms_median"] > 0 and manifest["addition_params"]["source"]
    assert {"astronomy-new", "cooking-new"} <= set(head_versions.load().head.live_ids())
    assert {"astronomy-new", "cooking-new"} <= set(head_versions.load().index.live_ids())  # drift statistics' vectors

    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")  # searches through the head
    assert served.unwrap_python_model().retriever.head.__class__.__name__ == "IncDSIHead"
    hits = served.predict(["A note on astronomy: a comet crossed the nebula", "knead the sourdough and bake it"],
                          params={"k": 3})
    assert "astronomy-new" in hits["doc_ids"][0] and "cooking-new" in hits["doc_ids"][1]

    assert rollback(MlflowRegistry(params, layout, uri), layout)["to_version"] == 1  # the head without the batch
    checkout(MlflowRegistry(params, layout, uri), layout)
    assert head_versions.current_name == "base" and "astronomy-new" not in head_versions.load().live_ids()
