"""The text of a version's documents (issue 45, item 2), versioned with the retriever: after each
update, whole copy or delta, the store of every version holds exactly the documents its
retriever can return, with the text of the latest batch that wrote each one, replayed from the
saved directories as a served model replays them. The expectation is computed here from the raw
source and batch files, not by the store."""

import json

import pytest

from model_code.config import load_params
from model_code.layout import Layout
from model_code.versions.apply import edit_documents, remove_documents, upsert_documents
from model_code.versions.chain import RetrieverVersions
from model_code.versions.documents import DocumentStore
from tests.conftest import run_stages, tiny_params
from tests.helpers.batches import write_batch


def apply_rows(expected: dict, rows: list[dict]) -> None:
    """What an upsert batch does to the documents, by hand."""
    for row in rows:
        if row.get("deleted"):
            expected.pop(row["_id"], None)
        else:
            expected[row["_id"]] = (row.get("title", ""), row["text"])


@pytest.mark.parametrize("kind", ["dense", "bm25"])  # dense versions are deltas (and whole copies); bm25 whole only
def test_every_version_holds_the_text_of_exactly_what_it_returns(tmp_path, beir_dir, tiny_model_dir, kind):
    params = tiny_params(beir_dir, tiny_model_dir, retriever={"kind": kind}, train={"enabled": False},
                         freshness={"full_copy_every": 3})
    layout = run_stages(tmp_path / "ws", params, "ingest", "train", "index")
    settings = load_params(layout.root / "params.yaml")
    expected = {row["_id"]: (row["title"], row["text"])
                for row in map(json.loads, (beir_dir / "corpus.jsonl").read_text().splitlines())}
    versions = RetrieverVersions(layout)
    store = versions.load_documents("base")
    assert {d["doc_id"]: (d["title"], d["text"]) for d in store.fetch(sorted(store.ids()))} == expected

    batches = [
        [{"_id": "new-1", "title": "volcano", "text": "lava magma eruption"},
         {"_id": "astronomy-0", "title": "edited", "text": "a replaced text about comets"},
         {"_id": "biology-1", "deleted": True}],
        [{"_id": "new-2", "title": "", "text": "ocean tides and currents"},
         {"_id": "new-1", "title": "volcano", "text": "lava magma eruption, second text"}],
        [{"_id": "new-2", "deleted": True}, {"_id": "new-3", "title": "t", "text": "glaciers melt"}],
        [{"_id": "new-4", "title": "t4", "text": "deserts and dunes"}],
    ]
    for number, rows in enumerate(batches):
        upsert_documents(layout, settings, write_batch(tmp_path / f"b{number}.jsonl", rows))
        apply_rows(expected, rows)
    edit_documents(layout, settings, write_batch(tmp_path / "edit.jsonl", [{"_id": "new-3", "title": "t",
                                                                               "text": "glaciers melt fast"}]))
    expected["new-3"] = ("t", "glaciers melt fast")
    remove_documents(layout, settings, ["new-4"])
    expected.pop("new-4")

    saved_whole = [not json.loads((versions.root / v / "manifest.json").read_text()).get("delta")
                   for v in sorted(p.name for p in versions.root.glob("v0*"))]
    assert len(saved_whole) == 6 and (any(saved_whole) and not all(saved_whole) if kind == "dense" else all(saved_whole))
    for name in ["base", *sorted(p.name for p in versions.root.glob("v0*"))]:  # each version agrees with its index
        assert versions.load_documents(name).ids() == set(versions.load_version(name).live_ids()), name
    latest = DocumentStore.load_chain(versions.chain(versions.current_name))  # as a server loads it
    assert {d["doc_id"]: (d["title"], d["text"]) for d in latest.fetch(sorted(latest.ids()))} == expected
    with pytest.raises(KeyError):
        latest.fetch(["biology-1"])


def test_a_version_saved_before_the_store_existed_has_none(tmp_path, beir_dir, tiny_model_dir):
    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False}),
                        "ingest", "train", "index")
    (layout.retriever / "document_store.parquet").unlink()
    assert RetrieverVersions(Layout(layout.root)).load_documents("base") is None
