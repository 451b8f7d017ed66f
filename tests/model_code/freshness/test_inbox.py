"""The inbox (``model_code/freshness/inbox.py``): files dropped in are accepted once settled,
deduplicated and quarantined when invalid; ``submit-documents`` drops a file into it."""

import json
import os
import time

import pytest

from model_code.cli import main
from model_code.data.tables import IngestError
from model_code.freshness.inbox import Inbox
from tests.helpers.batches import write_batch

DOCS = [{"_id": f"n{i}", "title": f"new {i}", "text": f"a new document number {i} about telescopes"} for i in range(3)]


def test_inbox_accepts_dedupes_and_quarantines(tmp_path):
    inbox = Inbox(tmp_path / "inbox", settle_seconds=5)  # the settled files are 10 s old; a loaded machine
    # can take more than the default 1 s between writing fresh.jsonl and the second look at the inbox
    write_batch(inbox.root / "a.jsonl", DOCS)
    write_batch(inbox.root / "a-copy.jsonl", DOCS)  # same bytes, other name
    (inbox.root / "broken.jsonl").write_text('{"_id": "x", "text": "fine"}\n{not json\n')
    os.utime(inbox.root / "broken.jsonl", (time.time() - 10, time.time() - 10))
    write_batch(inbox.root / "empty-texts.jsonl", [{"_id": "y", "text": ""}])
    write_batch(inbox.root / "fresh.jsonl", DOCS[:1], age_seconds=0)  # may still be being written
    (inbox.root / ".hidden.jsonl").write_text("partial")

    outcome = inbox.receive()
    assert [b.name for b in outcome["accepted"]] == ["a.jsonl"]  # arrival order: the twin written first wins
    assert outcome["duplicates"] == ["a-copy.jsonl"]
    assert sorted(outcome["quarantined"]) == ["broken.jsonl", "empty-texts.jsonl"]
    error = json.loads((inbox.quarantine_dir / "broken.jsonl.error.json").read_text())["error"]
    assert "broken.jsonl:2: malformed JSON" in error
    assert "no valid document" in json.loads((inbox.quarantine_dir / "empty-texts.jsonl.error.json").read_text())["error"]
    assert sorted(p.name for p in inbox.pending()) == []  # fresh.jsonl still settling, dot-file ignored
    assert (inbox.root / "fresh.jsonl").exists() and (inbox.root / ".hidden.jsonl").exists()

    batch = inbox.batches()[0]
    assert batch.path.exists() and batch.documents == 3 and batch.batch_id == batch.sha256[:16]
    assert inbox.batch(batch.batch_id) == batch
    assert inbox.read(batch).documents["doc_id"].tolist() == ["n0", "n1", "n2"]
    assert inbox.receive() == {"accepted": [], "duplicates": [], "quarantined": []}


def test_submit_documents_cli(tmp_path):
    good = write_batch(tmp_path / "good.jsonl", DOCS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    assert main(["submit-documents", str(good), "--root", str(tmp_path)]) == 0
    assert (tmp_path / "inbox" / "good.jsonl").read_bytes() == good.read_bytes()
    assert main(["submit-documents", str(good), "--root", str(tmp_path)]) == 0  # name taken: kept under another
    assert len(list((tmp_path / "inbox").glob("good*.jsonl"))) == 2
    assert main(["submit-documents", str(bad), "--root", str(tmp_path)]) == 2
    assert not (tmp_path / "inbox" / "bad.jsonl").exists()
    with pytest.raises(IngestError, match="expected a JSON object"):
        Inbox(tmp_path / "inbox").submit(bad)
    fresh = tmp_path / "fresh.jsonl"  # a file dropped by hand this instant waits to settle; a submitted one does not
    fresh.write_text(good.read_text().replace('"n', '"f'))
    assert main(["submit-documents", str(fresh), "--root", str(tmp_path)]) == 0
    (tmp_path / "inbox" / "by-hand.jsonl").write_text(good.read_text().replace('"n', '"h'))
    outcome = Inbox(tmp_path / "inbox").receive()
    # in the order submitted: the first good accepted, the second one a duplicate, then fresh
    assert [b.name for b in outcome["accepted"]] == ["good.jsonl", "fresh.jsonl"]
    assert [name.startswith("good-") for name in outcome["duplicates"]] == [True]
    assert (tmp_path / "inbox" / "by-hand.jsonl").exists()  # still settling
