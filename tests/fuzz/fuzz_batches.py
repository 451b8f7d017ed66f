"""atheris fuzz target of the document-batch reader (``make fuzz``; not part of ``make test``).

Any bytes, as a ``.jsonl`` or ``.parquet`` batch (the first byte picks which), must either load as
documents that satisfy the contract or be refused with an ``IngestError`` naming the file; any
other exception is a crash atheris reports with the input that caused it. Seeds and the inputs
the fuzzer found interesting live in ``tests/fuzz/corpus``.
"""

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["model_code"]):  # only the project's code
    from model_code.config import DataParams
    from model_code.data.batches import read_document_batch
    from model_code.data.tables import IngestError

LIMITS = DataParams()
WORKDIR = Path(tempfile.mkdtemp(prefix="fuzz-batches-"))


def test_one_input(data: bytes) -> None:
    path = WORKDIR / ("batch.parquet" if data[:1] == b"P" else "batch.jsonl")
    path.write_bytes(data[1:])
    try:
        changes = read_document_batch(path, LIMITS)
        documents, rejects = changes.documents, changes.rejects
    except IngestError as exc:
        assert path.name in str(exc), f"error does not name the file: {exc}"
        return
    for doc_id, text in zip(documents["doc_id"], documents["text"]):
        assert isinstance(doc_id, str) and 0 < len(doc_id) <= LIMITS.max_id_chars, doc_id
        assert isinstance(text, str) and LIMITS.min_text_chars <= len(text) <= LIMITS.max_text_chars
    assert documents["doc_id"].is_unique
    assert all(r["reason"] for r in rejects)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
