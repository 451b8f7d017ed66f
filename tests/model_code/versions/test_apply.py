"""Document updates through the retriever kinds: validated batches, versions, atomicity, no double application."""

import json

import pytest
import yaml
from mlflow import MlflowClient

from model_code.config import load_params
from model_code.layout import Layout
from model_code.stores.faiss_store import FaissStore
from model_code.versions.chain import RetrieverVersions
from tests.conftest import cli
from tests.helpers.batches import write_batch
from tracking.deployment import log_updates


def test_add_documents_then_retrieve_them_and_remove(deployed, tmp_path, mlflow_uri):
    new_doc = {"_id": "new-volcano", "title": "volcano", "text": "lava magma eruption crater ash plume"}
    batch = write_batch(tmp_path / "batch.jsonl", [
        new_doc,
        {"_id": "astronomy-0", "title": "dup", "text": "already indexed"},
        {"_id": "empty", "title": "", "text": ""},
    ])
    assert cli(deployed, "add-documents", str(batch)) == 0
    layout = Layout(deployed)
    versions = RetrieverVersions(layout)
    assert versions.current_name == "v0001"
    manifest = json.loads((versions.current_dir() / "manifest.json").read_text())
    assert (manifest["added"], manifest["rejected"], manifest["documents"]) == (1, 2, 49)
    reasons = [json.loads(line)["reason"] for line in (versions.current_dir() / "rejects.jsonl").read_text().splitlines()]
    assert sorted(reasons) == [f"doc_id: already indexed (to replace its text: fresh-retriever edit-documents {batch})",
                               "text: must be a non-empty string"]

    params = load_params(deployed / "params.yaml")
    retriever = versions.load()
    (hit,) = retriever.search([f"{new_doc['title']} {new_doc['text']}"], k=3)  # the document's own text, as BEIR joins it
    assert hit.doc_ids[0] == "new-volcano"

    assert cli(deployed, "add-documents", str(batch)) == 0  # the same file again: skipped
    assert versions.current_name == "v0001"

    uri = mlflow_uri  # every version is logged to MLflow once, with its timings
    assert log_updates(params, layout, tracking_uri=uri) == ["dense/v0001"]
    assert log_updates(params, layout, tracking_uri=uri) == []
    [run] = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("test").experiment_id], "tags.kind = 'index_update'")
    assert run.data.metrics["update.added"] == 1 and run.data.metrics["update.encode_ms_per_doc"] > 0

    assert cli(deployed, "remove-documents", "new-volcano", "astronomy-1") == 0
    assert versions.current_name == "v0002"
    remaining = versions.load().index
    assert len(remaining) == 47 and "new-volcano" not in remaining.live_ids()
    assert len(versions.load_version("v0001").index) == 49  # the previous version stays loadable


def test_a_crash_while_writing_leaves_the_current_version(deployed, tmp_path, monkeypatch):
    batch = write_batch(tmp_path / "b.jsonl", [{"_id": "n1", "title": "t", "text": "some new text"}])

    def crash(self, directory):
        (directory / "partial").mkdir(parents=True)
        raise OSError("disk full")

    monkeypatch.setattr(FaissStore, "save", crash)  # a version stored whole
    monkeypatch.setattr(FaissStore, "save_delta", crash)  # or as a delta
    with pytest.raises(OSError, match="disk full"):
        from model_code.versions.apply import add_documents

        add_documents(Layout(deployed), load_params(deployed / "params.yaml"), batch)
    versions = RetrieverVersions(Layout(deployed))
    assert versions.current_name == "base"
    assert not list(versions.root.glob("v*")) and not list(versions.root.glob(".*"))


def test_a_batch_with_nothing_valid_is_an_error(deployed, tmp_path, capsys):
    batch = write_batch(tmp_path / "bad.jsonl", [{"_id": "x", "text": ""}])
    assert cli(deployed, "add-documents", str(batch)) == 2
    assert "no valid documents to add" in capsys.readouterr().err


def use_incdsi(workspace, **settings):
    """Switch the workspace to retriever.kind incdsi (with ``settings``) and rebuild its index."""
    params_file = workspace / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params["retriever"] = {"kind": "incdsi", "incdsi": {**params["retriever"]["incdsi"], **settings}}
    params_file.write_text(yaml.safe_dump(params))
    assert cli(workspace, "index") == 0


def test_incdsi_head_build_add_and_retrieve(deployed, tmp_path):
    layout = Layout(deployed)
    assert not (layout.retriever / "head").exists()  # a dense workspace builds no head
    use_incdsi(deployed)  # over every document (head_documents: all)
    manifest = json.loads((layout.retriever / "manifest.json").read_text())
    head_manifest = manifest["head"]
    assert (manifest["kind"], head_manifest["documents"], head_manifest["covers"]) == ("incdsi", 48, "all")
    assert head_manifest["final_loss"] < head_manifest["first_loss"]
    addition = json.loads((layout.retriever / "head" / "addition.json").read_text())
    assert addition["source"] == "tuned" and len(addition["trials"]) == 1 + 3  # the head before, then 3 trials
    assert addition["simulation"]["additions"] >= 1 and addition["simulation"]["old_eval_queries"] > 0
    new_doc = {"_id": "new-volcano", "title": "volcano", "text": "lava magma eruption crater ash plume " * 3}
    batch = write_batch(tmp_path / "batch.jsonl", [new_doc])
    assert cli(deployed, "add-documents", str(batch)) == 0
    versions = RetrieverVersions(layout)
    manifest = json.loads((versions.current_dir() / "manifest.json").read_text())
    assert manifest["added"] == 1 and manifest["documents"] == 49 and manifest["add_ms_median"] > 0
    used = manifest["addition_params"]  # the tuned values, read from the head's addition.json
    assert used.pop("source").endswith("addition.json") and used == addition["params"]
    head = versions.load().head
    assert head.doc_ids[-1] == "new-volcano"
    assert head.doc_ids[int(head.scores(head.rep_queries[-1:]).argmax())] == "new-volcano"
    assert cli(deployed, "remove-documents", "new-volcano") == 0
    assert "new-volcano" not in versions.load().head.doc_ids
    assert "new-volcano" not in versions.load().index.live_ids()  # the kind keeps its two parts in step


def test_an_incdsi_head_over_the_old_documents_indexes_them_alone_and_takes_a_new_one(deployed, tmp_path):
    """Before: with ``head_documents: old`` the head covered the old documents but the dense index
    beside it (which the drift statistics and the adds write) covered the whole corpus, so adding
    one of the new documents, what the protocol is for, failed as "already indexed"."""
    import pandas as pd

    use_incdsi(deployed, head_documents="old", tune_trials=0)
    layout = Layout(deployed)
    base = RetrieverVersions(layout).load()
    assert sorted(base.index.live_ids()) == sorted(base.live_ids()) and len(base.live_ids()) == 43
    groups = pd.read_parquet(layout.ingested / "doc_groups.parquet")
    new_id = groups.loc[groups["group"] == "new", "doc_id"].iloc[0]
    assert new_id not in base.live_ids()
    batch = write_batch(tmp_path / "new.jsonl", [{"_id": new_id, "title": "volcano", "text": "lava magma crater " * 3}])
    assert cli(deployed, "add-documents", str(batch)) == 0
    added = RetrieverVersions(layout).load()
    assert new_id in added.live_ids() and sorted(added.index.live_ids()) == sorted(added.live_ids())


@pytest.mark.parametrize("kind", ["dense", "incdsi"])
def test_edit_documents_replaces_them_in_a_new_version(deployed, tmp_path, kind):
    if kind == "incdsi":  # untuned, rows starting from the documents' embeddings (the encoded-documents path),
        use_incdsi(deployed, tune_trials=0, init="document", head_documents="old")  # over the old documents
        head_manifest = json.loads((Layout(deployed).retriever / "manifest.json").read_text())["head"]
        assert (head_manifest["documents"], head_manifest["covers"]) == (43, "old")
    layout = Layout(deployed)
    versions = RetrieverVersions(layout)
    target = versions.load().live_ids()[0]
    edited = {"_id": target, "title": "volcano", "text": "lava magma eruption crater ash plume " * 3}
    batch = write_batch(tmp_path / "edit.jsonl", [edited, {"_id": "never-indexed", "text": "x y z"}])
    assert cli(deployed, "edit-documents", str(batch)) == 0
    manifest = json.loads((versions.current_dir() / "manifest.json").read_text())
    assert (manifest["operation"], manifest["edited"], manifest["rejected"]) == ("edit", 1, 1)
    reasons = [json.loads(line)["reason"] for line in (versions.current_dir() / "rejects.jsonl").read_text().splitlines()]
    assert reasons == [f"doc_id: not indexed (to add it: fresh-retriever add-documents {batch})"]
    retriever = versions.load()
    assert sorted(retriever.live_ids()) == sorted(versions.load_version("base").live_ids())  # same documents
    if kind == "dense":
        (hit,) = retriever.search([f"volcano. {edited['text']}"], k=1)
        assert hit.doc_ids == [target]
    else:
        assert manifest["addition_params"]["init"] == "document"
        head = retriever.head
        row = head.doc_ids.index(target)
        assert head.doc_ids[int(head.scores(head.rep_queries[row : row + 1]).argmax())] == target


def test_an_incdsi_deployment_is_evaluated_through_its_head(deployed, capsys):
    params_file = deployed / "params.yaml"
    settings = yaml.safe_load(params_file.read_text())
    settings["retriever"]["kind"] = "incdsi"
    params_file.write_text(yaml.safe_dump(settings))
    assert cli(deployed, "evaluate") == 2  # the dense retriever built before the switch
    assert "holds a dense retriever but retriever.kind is incdsi" in capsys.readouterr().err
    assert cli(deployed, "index") == 0
    assert cli(deployed, "evaluate") == 0
    metrics = json.loads((Layout(deployed).eval_report / "metrics.json").read_text())
    assert metrics["retriever"] == "incdsi" and metrics["queries"] > 0 and 0 < metrics["recall@10"] <= 1

    use_incdsi(deployed, head_documents="old", tune_trials=0)
    assert cli(deployed, "evaluate") == 2  # a head over the old documents only cannot serve the corpus
    assert "lacks 5 of the 48 ingested documents" in capsys.readouterr().err
