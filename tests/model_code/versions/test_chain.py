"""``versions/chain.py``: versions are numbered by number, so the one after v9999 is v10000 and
the next v10001 (as text, v10000 sorts before v9999: every commit after it was named v10000
again, swapped over the last, and named itself its parent)."""

import os

from model_code.layout import Layout
from model_code.versions.chain import RetrieverVersions
from tests.conftest import cli
from tests.helpers.batches import write_batch


def test_the_version_after_v9999_is_v10000_then_v10001(deployed, tmp_path):
    versions = RetrieverVersions(Layout(deployed))

    def add(doc_id: str) -> str:
        batch = write_batch(tmp_path / f"{doc_id}.jsonl", [{"_id": doc_id, "title": "", "text": f"lava flow {doc_id}"}])
        assert cli(deployed, "add-documents", str(batch)) == 0
        return versions.current_name

    assert add("new-1") == "v0001"
    os.rename(versions.root / "v0001", versions.root / "v9999")  # as after 9,999 updates
    (versions.root / "CURRENT").write_text("v9999\n")
    assert [add("new-2"), add("new-3")] == ["v10000", "v10001"]
    assert [p.name for p in versions.chain("v10001")][-3:] == ["v9999", "v10000", "v10001"]
    assert {"new-1", "new-2", "new-3"} <= set(versions.load().live_ids())
