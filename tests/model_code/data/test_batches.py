"""``data/batches.py``: every rejected row of a batch names the file the user dropped, whatever
copy was read (the inbox reads a copy named by a random hex)."""

import json

from model_code.config import DataParams
from model_code.data.batches import describe_reject, read_document_batch


def test_each_reject_names_the_file_given_not_the_copy_read(tmp_path):
    copy = tmp_path / ".0f3a9c.jsonl"
    rows = [{"_id": "ok", "text": "lava flow"}, {"text": "no id"}, {"_id": 7, "text": "a number"},
            {"_id": "flag", "deleted": "yes"}, {"_id": "short", "text": ""}, {"_id": "ok", "text": "again"}]
    copy.write_text("".join(json.dumps(row) + "\n" for row in rows))
    batch = read_document_batch(copy, DataParams(), "volcanoes.jsonl")
    assert batch.documents["doc_id"].tolist() == ["ok"]
    assert [describe_reject(r).split(": ")[0] for r in batch.rejects] == [f"volcanoes.jsonl:{n}" for n in (2, 3, 4, 5, 6)]
