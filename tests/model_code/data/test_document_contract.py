"""One document contract for every way a document enters: corpus ingest, the inbox (files dropped
in and ``submit-documents``), ``add-documents`` and ``edit-documents`` accept and reject the same
rows for the same reasons, files that are not UTF-8 are rejected whole with their name and the
offending byte, and an id that already exists is never silently skipped. Property-based tests
(hypothesis) feed arbitrary files to the batch reader and the inbox."""

import json
import re
import shutil
import string
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_code.cli import main
from model_code.config import DataParams, load_params
from model_code.data.batches import read_document_batch
from model_code.data.tables import IngestError
from model_code.freshness.inbox import Inbox
from model_code.layout import Layout
from model_code.versions.chain import RetrieverVersions
from tests.conftest import tiny_params

LIMITS = {"max_text_chars": 300, "max_id_chars": 12, "min_text_chars": 5}  # the tiny corpus fits
BAD_ROWS = [  # (the BEIR line, the field the contract must name); hand-written against LIMITS
    ({"_id": "bad-long", "title": "t", "text": "x" * 301}, "text"),
    ({"_id": "bad-short", "title": "t", "text": "abcd"}, "text"),
    ({"_id": "an-id-longer-than-12", "title": "t", "text": "a fine text"}, "doc_id"),
    ({"_id": 42, "title": "t", "text": "a numeric id"}, "doc_id"),
    ({"_id": "bad-type", "title": "t", "text": ["not", "a", "string"]}, "text"),
    ({"_id": "bad-empty", "title": "t", "text": "   "}, "text"),
    ({"title": "t", "text": "no id at all"}, "doc_id"),
    ({"_id": "bad-title", "title": "y" * 301, "text": "a fine text"}, "title"),
    ({"_id": "two words", "title": "t", "text": "an id a run file splits"}, "doc_id"),
    ({"_id": "line\u2028sep", "title": "t", "text": "an id a run file splits"}, "doc_id"),
]
GOOD = [{"_id": "good-1", "title": "volcano", "text": "lava magma crater ash"},
        {"_id": "good-2", "title": "", "text": "exactly 300 " + "z" * 288}]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rejected(records) -> list[tuple[int, str]]:
    """(line, field) of each reject record, the part every entry point must agree on."""
    return sorted((r["line"], r["field"]) for r in records)


def expected(first_line: int) -> list[tuple[int, str]]:
    return sorted((first_line + i, field) for i, (_, field) in enumerate(BAD_ROWS))


@pytest.fixture
def contract_workspace(tmp_path, beir_dir, tiny_model_dir):
    """A workspace whose corpus also holds the bad rows, indexed with the tiny encoder."""
    corpus = beir_dir / "corpus.jsonl"
    base_lines = len(corpus.read_text().splitlines())
    with corpus.open("a") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row, _ in BAD_ROWS))
    root = tmp_path / "workspace"
    root.mkdir()
    params = tiny_params(beir_dir, tiny_model_dir, data={**LIMITS}, train={"enabled": False})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["all", "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    return root, base_lines


def test_every_entry_point_rejects_the_same_rows_for_the_same_fields(contract_workspace, tmp_path, capsys):
    root, base_lines = contract_workspace
    params = load_params(root / "params.yaml")
    layout = Layout(root)
    ingest_rejects = [json.loads(line) for line in (layout.ingest_report / "rejects.jsonl").read_text().splitlines()]
    assert rejected([r for r in ingest_rejects if r["table"] == "corpus"]) == expected(base_lines + 1)  # ingest

    batch = write_rows(tmp_path / "batch.jsonl", GOOD + [row for row, _ in BAD_ROWS])
    changes = read_document_batch(batch, params.data)
    documents, batch_rejects = changes.documents, changes.rejects
    assert rejected(batch_rejects) == expected(len(GOOD) + 1)  # the reader every batch path calls
    assert sorted(documents["doc_id"]) == ["good-1", "good-2"]

    inbox = Inbox(layout.inbox, settle_seconds=0, data=params.data)
    assert main(["submit-documents", str(batch), "--root", str(root), "--params", str(root / "params.yaml")]) == 0
    [accepted] = inbox.receive()["accepted"]  # submit, then the inbox sensor
    assert (accepted.documents, accepted.rejected) == (2, len(BAD_ROWS))

    assert main(["add-documents", str(batch), "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    versions = RetrieverVersions(layout)
    add_rejects = [json.loads(line) for line in (versions.current_dir() / "rejects.jsonl").read_text().splitlines()]
    assert rejected(add_rejects) == expected(len(GOOD) + 1)

    edits = write_rows(tmp_path / "edits.jsonl", [{**GOOD[0], "text": "lava flows to the sea"}]
                       + [row for row, _ in BAD_ROWS])
    assert main(["edit-documents", str(edits), "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    edit_rejects = [json.loads(line) for line in (versions.current_dir() / "rejects.jsonl").read_text().splitlines()]
    assert rejected(edit_rejects) == expected(2)


def test_an_existing_id_is_rejected_with_the_command_that_edits_it_never_skipped(contract_workspace, tmp_path, capsys):
    root, _ = contract_workspace
    params_file = str(root / "params.yaml")
    again = write_rows(tmp_path / "again.jsonl", [{"_id": "astronomy-0", "title": "t", "text": "different text"}])
    assert main(["add-documents", str(again), "--params", params_file, "--root", str(root)]) == 2
    error = capsys.readouterr().err
    assert "no valid documents to add" in error and f"fresh-retriever edit-documents {again}" in error
    assert RetrieverVersions(Layout(root)).current_name == "base"  # nothing written
    assert main(["edit-documents", str(again), "--params", params_file, "--root", str(root)]) == 0  # what it says


def test_a_file_that_is_not_utf8_is_rejected_whole_naming_the_file_and_the_byte(workspace, tmp_path, capsys):
    batch = tmp_path / "latin1.jsonl"
    content = b'{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "caf\xe9"}\n'
    batch.write_bytes(content)
    where = f"byte {content.index(bytes([0xE9]))} (line 2)"
    with pytest.raises(IngestError, match=rf"latin1\.jsonl: not UTF-8 text: {re.escape(where)}"):
        read_document_batch(batch, DataParams())
    assert main(["submit-documents", str(batch), "--root", str(workspace),
                 "--params", str(workspace / "params.yaml")]) == 2
    assert where in capsys.readouterr().err
    inbox = Inbox(workspace / "inbox", settle_seconds=0)
    inbox.root.mkdir()
    shutil.copy(batch, inbox.root / "latin1.jsonl")
    assert inbox.receive()["quarantined"] == ["latin1.jsonl"] and inbox.batches() == []
    report = json.loads((inbox.quarantine_dir / "latin1.jsonl.error.json").read_text())
    assert where in report["error"]


def _independently_valid(row: dict, limits: DataParams) -> bool:
    """The contract restated from its documentation, not from the validation code."""
    doc_id, text, title = row.get("_id"), row.get("text"), row.get("title")
    return (isinstance(doc_id, str) and doc_id.strip() != "" and len(doc_id) <= limits.max_id_chars
            and isinstance(text, str) and text.strip() != "" and limits.min_text_chars <= len(text) <= limits.max_text_chars
            and (title is None or (isinstance(title, str) and len(title) <= limits.max_text_chars)))


VALUES = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.booleans(),
                   st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
                   st.text(alphabet=string.ascii_letters, min_size=295, max_size=305),
                   st.lists(st.integers(), max_size=2))
ROWS = st.fixed_dictionaries({}, optional={"_id": VALUES, "title": VALUES, "text": VALUES, "extra": VALUES})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROWS, max_size=6), line_end=st.sampled_from(["\n", "\r\n"]))
def test_any_batch_of_json_rows_is_split_exactly_as_the_contract_says(tmp_path, rows, line_end):
    """Every row is either accepted or rejected with its line; accepted rows are exactly those the
    documented contract allows (first occurrence of an id wins)."""
    limits = DataParams(**LIMITS)
    batch = tmp_path / "rows.jsonl"
    batch.write_text("".join(json.dumps(r, ensure_ascii=False) + line_end for r in rows), encoding="utf-8")
    try:
        changes = read_document_batch(batch, limits)
        documents, rejects = changes.documents, changes.rejects
    except IngestError as exc:
        assert not rows and str(batch) in str(exc)  # only an empty file is refused whole
        return
    seen, expected_ids = set(), []
    for row in rows:
        if _independently_valid(row, limits) and row["_id"] not in seen:
            expected_ids.append(row["_id"])
        parsed = isinstance(row.get("_id"), str) and isinstance(row.get("text"), str) and isinstance(
            row.get("title"), str | None)
        if parsed:  # a row with the wrong JSON types is rejected on reading and claims no id
            seen.add(row["_id"])
    assert documents["doc_id"].tolist() == expected_ids
    assert len(documents) + len(rejects) == len(rows)
    assert all(r["line"] is not None and r["reason"] for r in rejects)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=300))
def test_any_bytes_dropped_in_the_inbox_are_accepted_or_quarantined_and_the_ledger_stays_right(tmp_path, content):
    """Random bytes never crash the inbox: the file is accepted (a ledger line with its valid
    documents) or quarantined with an error report naming it; the ledger only ever grows by it."""
    inbox = Inbox(Path(tempfile.mkdtemp(dir=tmp_path)) / "inbox", settle_seconds=0)
    inbox.root.mkdir()
    (inbox.root / "random.jsonl").write_bytes(content)
    outcome = inbox.receive()
    if outcome["quarantined"]:
        report = json.loads((inbox.quarantine_dir / "random.jsonl.error.json").read_text())
        assert report["file"] == "random.jsonl" and report["error"] and inbox.batches() == []
    else:
        [batch] = inbox.batches()
        assert batch.documents >= 1 and batch.path.read_bytes() == content
    assert not (inbox.root / "random.jsonl").exists()


def test_document_ids_are_data_never_paths(contract_workspace, tmp_path):
    """Ids with path separators, parent references and NUL are stored and served as given and
    never become a file or directory name."""
    root, _ = contract_workspace
    ids = ["../../escape", "a/b/c", "/abs", "nul\x00id"]
    rows = [{"_id": doc_id, "title": "volcano", "text": f"lava magma crater number {n}"} for n, doc_id in enumerate(ids)]
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    batch = write_rows(tmp_path / "odd-ids.jsonl", rows)
    assert main(["add-documents", str(batch), "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    retriever = RetrieverVersions(Layout(root)).load()
    assert set(ids) <= set(retriever.live_ids())
    created = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")} - before
    assert not [p for p in created if any(part in {"escape", "a", "b", "c", "abs"} or "\x00" in part for part in p.parts)]
    assert not (tmp_path.parent / "escape").exists() and not Path("/abs").exists()
