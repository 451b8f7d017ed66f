"""A lineage's commit log, kept in its Milvus collection: the updates every server following the
champion serves the moment they are committed, before (and without needing) a registered model
version (``index.backend: milvus``).

Why in the collection: an update's rows are invisible until a version lists their write-sets
(``milvus_store``), and a registered version used to be the only such list, so a batch waited for
the model registry before any server saw it. A *commit row* is that list's next entry, written
where the rows are: one insert of one row, so it is there whole or not at all. An update writes its
rows, logs the delta a server replays (write-sets, the documents' text: kilobytes) to its run, then
commits; logging its model and registering the version afterwards record what was committed. A server following
the champion serves the registered champion plus the chain of commits that extend it; a crash
after the commit leaves the batch served whole, and the next writer registers it
(``tracking.deployment.MlflowRegistry.register_commits``) instead of applying it again.

A rollback within a lineage *revokes* the commits the version it moves to does not hold (one
revocation row each, before the alias moves), or servers would extend the earlier version with them
again. Both kinds of row carry ``removes`` = ``COMMIT_ROW`` / ``REVOCATION_ROW``, which no view's
filter matches (vector rows have -1, tombstones a row id), and their record as JSON in ``doc_id``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from model_code.stores.milvus_store import (
    ID_CHARS,
    Connection,
    MilvusStoreError,
    _all_rows,
    new_write_set,
    open_collection,
    references_in,
    resolve_uri,
)

COMMIT_ROW = -2  # ``removes`` of a commit row
REVOCATION_ROW = -3  # ``removes`` of a row that revokes a commit


@dataclass(frozen=True)
class Commit:
    """One committed update: the retriever version it made (``version``, a delta of ``delta_of``,
    both names in the lineage's chain), where that delta's files are (``delta_uri``, an artifact of
    run ``run_id``, which logs its model afterwards), the alias it extends, the tags its registered
    version gets, and the write-sets it holds per collection (what ``fresh-registry gc`` keeps while
    it is served unregistered)."""

    version: str
    delta_of: str
    delta_uri: str
    run_id: str
    alias: str
    tags: dict[str, str] = field(default_factory=dict)
    write_sets: dict[str, list[int]] = field(default_factory=dict)
    written_as: int = 0  # the write-set of the commit row itself (its ``born``)


class CommitLog:
    """The commit and revocation rows of one collection that belong to one deployment, read
    incrementally (rows only grow). ``belongs(commit)`` tells a deployment's own commits from
    those of another registry whose versions share the collection (a copied registry, as the
    tests' deployments are): a commit is identified by the run that logged its artifacts."""

    def __init__(self, connection: Connection, belongs: Callable[[Commit], bool]):
        self.connection, self.belongs = connection, belongs
        self.commits: dict[str, Commit] = {}  # this deployment's, by retriever version
        self.revoked: set[str] = set()  # run ids of revoked commits
        self._last_row, self._opened = -1, False
        self._placeholder = None

    @classmethod
    def of_tags(cls, tags: dict[str, str], belongs: Callable[[Commit], bool]) -> CommitLog | None:
        """The log of the collection a registered version's tags name; None for a retriever in files."""
        if "index_collection" not in tags:
            return None
        return cls(Connection(uri=resolve_uri(tags["index_uri"]), collection=tags["index_collection"], dimension=0,
                              token=tags.get("index_token_env")), belongs)

    def exists(self) -> bool:
        with self.connection.calling("looking for the collection"):
            return self.connection.client.has_collection(self.connection.collection, timeout=self.connection.timeout_s)

    def read(self) -> CommitLog:
        """Take in the rows written since the last read (the first read loads a released collection)."""
        if not self._opened:
            open_collection(self.connection, "a registered version")
            self._opened = True
        with self.connection.calling("reading the commit log"):
            rows = _all_rows(self.connection.client, self.connection.collection,
                             f"row > {self._last_row} and removes in [{COMMIT_ROW}, {REVOCATION_ROW}]",
                             ["row", "removes", "doc_id", "born"], self.connection.timeout_s)
        for row in rows:
            record = json.loads(row["doc_id"])
            if row["removes"] == COMMIT_ROW:
                commit = Commit(**record, written_as=row["born"])
                if self.belongs(commit):
                    self.commits[commit.version] = commit
            else:
                self.revoked.add(record["revokes"])
            self._last_row = max(self._last_row, row["row"])
        return self

    def next_after(self, version: str, alias: str) -> Commit | None:
        """The unrevoked commit of ``alias`` that extends retriever version ``version``, if any
        (one at most: writers of a deployment hold its lock, and a rollback revokes a branch
        before another can start from the same version)."""
        found = [c for c in self.commits.values()
                 if c.delta_of == version and c.alias == alias and c.run_id not in self.revoked]
        return max(found, key=lambda c: c.written_as) if found else None

    def is_revoked(self, version: str) -> bool:
        return version in self.commits and self.commits[version].run_id in self.revoked

    def ancestors(self, version: str) -> set[str]:
        """``version`` and the committed versions it extends."""
        held = set()
        while version not in held:
            held.add(version)
            if version not in self.commits:
                break
            version = self.commits[version].delta_of
        return held

    def served_write_sets(self) -> dict[str, set[int]]:
        """Per collection, the write-sets of unrevoked commits (and of their commit rows)."""
        kept: dict[str, set[int]] = {}
        for commit in self.commits.values():
            if commit.run_id not in self.revoked:
                for collection, write_sets in commit.write_sets.items():
                    kept.setdefault(collection, set()).update(write_sets)
                kept.setdefault(self.connection.collection, set()).add(commit.written_as)
        return kept

    def commit(self, commit: Commit) -> None:
        """Write the commit row: from here on every server following ``commit.alias`` serves it."""
        record = {k: v for k, v in asdict(commit).items() if k != "written_as"}
        self._insert(COMMIT_ROW, record, what=f"committing update {commit.version}")

    def revoke(self, commit: Commit, reason: str) -> None:
        """Write a revocation row for ``commit``, born in its commit row's write-set (``gc`` keeps
        or deletes the two together)."""
        self._insert(REVOCATION_ROW, {"revokes": commit.run_id, "version": commit.version, "reason": reason},
                     born=commit.written_as, what=f"revoking update {commit.version}")
        self.revoked.add(commit.run_id)

    def _insert(self, removes: int, record: dict, what: str, born: int | None = None) -> None:
        text = json.dumps(record, separators=(",", ":"), sort_keys=True)
        if len(text) > ID_CHARS:
            raise MilvusStoreError(f"{self.connection.where()}: {what}: its record is {len(text)} characters, a row "
                                   f"holds {ID_CHARS}")
        row = {"doc_id": text, "born": new_write_set() if born is None else born, "removes": removes,
               "vector": self._vector()}
        with self.connection.calling(what):
            self.connection.client.insert(self.connection.collection, [row], timeout=self.connection.timeout_s)

    def _vector(self):
        """A placeholder of the collection's vector field (never searched: no view's filter matches)."""
        if self._placeholder is None:
            with self.connection.calling("describing the collection"):
                fields = self.connection.client.describe_collection(self.connection.collection,
                                                                    timeout=self.connection.timeout_s)["fields"]
            vector = next(f for f in fields if f["name"] == "vector")
            if "dim" in vector.get("params", {}):
                self._placeholder = np.zeros(int(vector["params"]["dim"]), dtype=np.float32)
            else:  # sparse: Milvus refuses an empty one
                self._placeholder = {0: 1.0}
        return self._placeholder


def written_by(version_dir: Path, held: list[Path]) -> dict[str, list[int]]:
    """Per collection, the write-sets the saved retriever in ``version_dir`` refers to and none of
    the directories ``held`` (its parent's chain) does: what the update wrote."""
    old = {(r["collection"], w) for directory in held for r in references_in(directory) for w in r["write_sets"]}
    new: dict[str, list[int]] = {}
    for reference in references_in(version_dir):
        for write_set in reference["write_sets"]:
            if (reference["collection"], write_set) not in old:
                new.setdefault(reference["collection"], []).append(write_set)
    return new
