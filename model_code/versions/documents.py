"""The text of the documents a retriever version can return, versioned with it.

A search endpoint that answers only ids sends every client to a second lookup, and that lookup
must agree with the version that answered: a document edited by a later update shows its new
text only once the version holding the edit answers. So the store lives in the same saved
directories as the retriever (``STORE_FILE`` beside the kind's files): a whole copy holds every
live document, the index stage's from the ingested corpus; a delta holds the rows one update
upserted and the ids it removed. ``load_chain`` replays them as ``retrievers.load_chain`` replays
the kind's deltas, and a server following the champion applies each delta to both under one lock.

Documents are kept in a dict (id -> title, text): an update touches only its rows, so replaying a
delta costs its size, not the corpus's.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

STORE_FILE = "document_store.parquet"
COLUMNS = ["doc_id", "title", "text"]


class DocumentStore:
    """Title and text by document id, with the changes made since it was loaded (for a delta)."""

    def __init__(self, documents: pd.DataFrame):
        self._documents = {doc_id: (title, text) for doc_id, title, text in documents[COLUMNS].itertuples(index=False)}
        self._upserted: dict[str, tuple[str, str]] = {}
        self._removed: set[str] = set()

    def __len__(self) -> int:
        return len(self._documents)

    def ids(self) -> set[str]:
        return set(self._documents)

    def upsert(self, documents: pd.DataFrame) -> None:
        """Add documents (``doc_id``, ``title``, ``text``), replacing those with the same id."""
        for doc_id, title, text in documents[COLUMNS].itertuples(index=False):
            self._documents[doc_id] = self._upserted[doc_id] = (title, text)
            self._removed.discard(doc_id)

    def remove(self, doc_ids: Iterable[str]) -> None:
        for doc_id in doc_ids:
            self._documents.pop(doc_id, None)
            self._upserted.pop(doc_id, None)
            self._removed.add(doc_id)

    def fetch(self, doc_ids: Iterable[str]) -> list[dict[str, str]]:
        """``{"doc_id", "title", "text"}`` of each id, in order (an id the store lacks raises
        KeyError: the store and its retriever disagree, which versioning them together rules out)."""
        return [{"doc_id": doc_id, "title": self._documents[doc_id][0], "text": self._documents[doc_id][1]}
                for doc_id in doc_ids]

    # -- persistence, beside the retriever's own files ----------------------------------------
    def save(self, directory: Path) -> None:
        """Every document, for a whole saved version."""
        _write(directory, self._documents, set())

    def save_delta(self, directory: Path) -> None:
        """What changed since it was loaded (or built), for a delta version."""
        _write(directory, self._upserted, self._removed)

    def apply_delta(self, directory: Path) -> None:
        """Replay a delta ``save_delta`` wrote, on the version it was made from (not recorded as
        a change of this store: a served version replays deltas for as long as it runs)."""
        rows = pd.read_parquet(Path(directory) / STORE_FILE)
        for doc_id, title, text, deleted in rows[[*COLUMNS, "deleted"]].itertuples(index=False):
            if deleted:
                self._documents.pop(doc_id, None)
            else:
                self._documents[doc_id] = (title, text)

    @classmethod
    def load_chain(cls, directories: list[Path]) -> DocumentStore | None:
        """The store a whole copy (``directories[0]``) and the deltas after it describe; None when
        the versions were saved without one (before the store existed)."""
        if not all((Path(d) / STORE_FILE).is_file() for d in directories):
            return None
        store = cls(pd.read_parquet(Path(directories[0]) / STORE_FILE))
        for directory in directories[1:]:
            store.apply_delta(directory)
        return store


def _write(directory: Path, documents: dict[str, tuple[str, str]], removed: set[str]) -> None:
    """Rows of ``documents`` and of the ``removed`` ids (``deleted`` true, no text)."""
    kept = pd.DataFrame([(doc_id, title, text, False) for doc_id, (title, text) in documents.items()],
                        columns=[*COLUMNS, "deleted"])
    gone = pd.DataFrame({"doc_id": sorted(removed), "title": "", "text": "", "deleted": True})
    frame = pd.concat([kept, gone], ignore_index=True) if len(gone) else kept
    Path(directory).mkdir(parents=True, exist_ok=True)
    frame.astype({"deleted": bool}).to_parquet(Path(directory) / STORE_FILE, index=False)
