"""A lineage's commit log, kept beside its Milvus collection: the updates every server following
the champion serves the moment they are committed, before (and without needing) a registered model
version (``index.backend: milvus``).

Why a log on the Milvus server: an update's rows are invisible until a version lists their
write-sets (``milvus_store``), and a registered version used to be the only such list, so a batch
waited for the model registry before any server saw it. A *commit row* is that list's next entry,
written on the server that holds the rows: one insert of one row, so it is there whole or not at
all. An update writes its rows, logs the delta a server replays (write-sets, the documents' text:
kilobytes) to its run, then commits; logging its model and registering the version afterwards
record what was committed. A server following the champion serves the registered champion plus
the chain of commits that extend it; a crash after the commit leaves the batch served whole, and
the next writer registers it (``tracking.deployment.MlflowRegistry.register_commits``) instead of
applying it again.

Why a collection of its own (``<lineage>_commits``, made by the first commit, dropped with the
lineage by ``fresh-registry gc``): every server worker reads the log every
``serve.refresh_seconds``. Milvus Lite answers a filtered query by visiting every row of the
collection in Python, so a log kept among the lineage's 100k vector rows cost 460 ms a read on a
loopback Lite server (2-core AMD EPYC), one worker's polling alone keeping the server busy; a
collection of a few rows per update costs a round trip.

A rollback within a lineage *revokes* the commits the version it moves to does not hold (one
revocation row each, before the alias moves), or servers would extend the earlier version with them
again. ``fresh-registry gc`` *trims* the commits no server needs any more (registered, and held by
what their alias names: ``tracking.collections``), which would otherwise cost every poll more for
the lineage's life: it writes a trim row, then deletes theirs. A row's ``kind`` says which it is;
its record is JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from model_code.stores.milvus_store import (
    COMMIT_LOG_SUFFIX,
    Connection,
    MilvusStoreError,
    all_rows,
    open_collection,
    references_in,
    resolve_uri,
)

COMMIT, REVOCATION, TRIM = 1, 2, 3  # a row's ``kind``
RECORD_CHARS = 65535  # the longest record a row holds (Milvus's longest VARCHAR)
TRIM_CHUNK = 1000  # commits a trim row names: their versions and row ids fit a record with room to spare
PLACEHOLDER = [1.0, 0.0]  # every row's vector: Milvus needs a vector field, and nothing searches this one


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
    row: int = 0  # the commit row's auto id (``next_after`` prefers the higher of two commits of one version)


class CommitLog:
    """The commit and revocation rows of one lineage that belong to one deployment, read again
    whenever the log changed. ``belongs(commit)`` tells a deployment's own commits from
    those of another registry whose versions share the lineage (a copied registry, as the tests'
    deployments are): a commit is identified by the run that logged its artifacts."""

    def __init__(self, lineage: Connection, belongs: Callable[[Commit], bool]):
        self.lineage, self.belongs = lineage, belongs
        self.connection = replace(lineage, collection=lineage.collection + COMMIT_LOG_SUFFIX, dimension=len(PLACEHOLDER),
                                  index_type="FLAT")
        self.commits: dict[str, Commit] = {}  # this deployment's, by retriever version
        self.revoked: set[str] = set()  # run ids of revoked commits
        self._seen, self._opened = (0, 0), False  # (rows, trim rows) of the log taken in; whether it is loaded

    @classmethod
    def of_tags(cls, tags: dict[str, str], belongs: Callable[[Commit], bool]) -> CommitLog | None:
        """The log of the collection a registered version's tags name; None for a retriever in files."""
        if "index_collection" not in tags:
            return None
        return cls(Connection(uri=resolve_uri(tags["index_uri"]), collection=tags["index_collection"], dimension=0,
                              token=tags.get("index_token_env")), belongs)

    def exists(self) -> bool:
        """Whether anything was ever committed in this lineage (the first commit makes the log)."""
        with self.connection.calling("looking for the commit log"):
            return self.connection.client.has_collection(self.connection.collection, timeout=self.connection.timeout_s)

    def read(self) -> CommitLog:
        """Take in what was written since the last read: two counts when nothing was, the whole log
        (a row or two per update not yet trimmed) when either changed. The rows alone could stay
        as many when a trim deleted as many rows as were committed between two polls; trim rows
        are never deleted, so their count tells. Nothing assumes that rows become visible in the
        order of their ids, which a Milvus cluster does not promise (each proxy hands out ids from
        a block of its own)."""
        if not self._opened:
            if not self.exists():
                return self  # nothing committed yet
            self._open()
        try:
            rows = self._rows_if_grown()
        except MilvusStoreError:  # the server restarted since the log was loaded (it holds it released)
            self._open()
            rows = self._rows_if_grown()
        if rows is None:
            return self
        ours, revoked, trimmed = [], set(), set()
        for row in rows:
            record = json.loads(row["record"])
            if row["kind"] == COMMIT:
                commit = Commit(**record, row=row["row"])
                if self.belongs(commit):
                    ours.append(commit)
            elif row["kind"] == REVOCATION:
                revoked.add(record["revokes"])
            elif row["kind"] == TRIM:
                trimmed.update(record.get("rows", []))
        # a version name written twice (a rollback, then an update from a host that had not seen the
        # revoked one's name): the unrevoked commit is the version, whichever row id a cluster gave it
        commits: dict[str, Commit] = {}
        for commit in sorted(ours, key=lambda c: (c.run_id not in revoked, c.row)):
            commits[commit.version] = commit
        self.commits, self.revoked = commits, revoked
        # read between a trim's row and its delete: the counts taken in hold rows about to go, which as many
        # rows written after the delete would restore, so the next poll reads the log whole whatever it counts
        midway = not trimmed.isdisjoint(row["row"] for row in rows)
        self._seen = (-1, -1) if midway else (len(rows), sum(row["kind"] == TRIM for row in rows))
        return self

    def _rows_if_grown(self) -> list[dict] | None:
        """The log's rows, None when its counts are those last taken in: all rows first, then the
        trim rows (a trim writes its row before deleting, so one that deleted after the second
        count left the first as it was)."""
        client, name, timeout = self.connection.client, self.connection.collection, self.connection.timeout_s
        with self.connection.calling("reading the commit log"):
            if (self._count(""), self._count(f"kind == {TRIM}")) == self._seen:
                return None
            return all_rows(client, name, "", ["row", "kind", "record"], timeout)

    def _count(self, where: str) -> int:
        return self.connection.client.query(self.connection.collection, filter=where, output_fields=["count(*)"],
                                            timeout=self.connection.timeout_s)[0]["count(*)"]

    def next_after(self, version: str, alias: str) -> Commit | None:
        """The unrevoked commit of ``alias`` that extends retriever version ``version``, if any
        (one at most: writers of a deployment hold its lock, and a rollback revokes a branch
        before another can start from the same version)."""
        found = [c for c in self.commits.values()
                 if c.delta_of == version and c.alias == alias and c.run_id not in self.revoked]
        return max(found, key=lambda c: c.row) if found else None

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
        """Per collection, the write-sets of unrevoked commits."""
        kept: dict[str, set[int]] = {}
        for commit in self.commits.values():
            if commit.run_id not in self.revoked:
                for collection, write_sets in commit.write_sets.items():
                    kept.setdefault(collection, set()).update(write_sets)
        return kept

    def commit(self, commit: Commit) -> None:
        """Write the commit row: from here on every server following ``commit.alias`` serves it."""
        record = {k: v for k, v in asdict(commit).items() if k != "row"}
        self._insert(COMMIT, record, what=f"committing update {commit.version}")

    def revoke(self, commit: Commit, reason: str) -> None:
        """Write a revocation row for ``commit``."""
        self._insert(REVOCATION, {"revokes": commit.run_id, "version": commit.version, "reason": reason},
                     what=f"revoking update {commit.version}")
        self.revoked.add(commit.run_id)

    def trim(self, settled: list[Commit], reason: str) -> None:
        """Delete the rows of commits no server needs any more (the caller's judgement), at most
        ``TRIM_CHUNK`` at a time, each chunk after a trim row that tells every reader to read the
        log again and names the rows it deletes. The row also carries an empty ``revokes``: servers
        of versions registered before trimming existed read every row that is not a commit as a
        revocation of its ``revokes``, and would fail on every poll without one."""
        ordered = sorted(settled, key=lambda c: c.version)
        for start in range(0, len(ordered), TRIM_CHUNK):
            chunk = ordered[start:start + TRIM_CHUNK]
            rows = [c.row for c in chunk]
            self._insert(TRIM, {"versions": [c.version for c in chunk], "rows": rows, "revokes": "", "reason": reason},
                         what=f"trimming {len(chunk)} commits")
            with self.connection.calling(f"deleting {len(chunk)} commit rows"):
                self.connection.client.delete(self.connection.collection, ids=rows, timeout=self.connection.timeout_s)
            for commit in chunk:
                self.commits.pop(commit.version, None)

    def _insert(self, kind: int, record: dict, what: str) -> None:
        text = json.dumps(record, separators=(",", ":"), sort_keys=True)
        if len(text) > RECORD_CHARS:
            raise MilvusStoreError(f"{self.connection.where()}: {what}: its record is {len(text)} characters, a row "
                                   f"holds {RECORD_CHARS}")
        if not self._opened:
            self._create()
        with self.connection.calling(what):
            self.connection.client.insert(self.connection.collection, [{"kind": kind, "record": text,
                                                                        "vector": PLACEHOLDER}],
                                          timeout=self.connection.timeout_s)

    def _create(self) -> None:
        """Make the log if no commit has yet, then open it."""
        from pymilvus import DataType, MilvusClient

        client, name, timeout = self.connection.client, self.connection.collection, self.connection.timeout_s
        if not self.exists():
            schema = MilvusClient.create_schema(auto_id=True, enable_dynamic_field=False)
            schema.add_field("row", DataType.INT64, is_primary=True)
            schema.add_field("kind", DataType.INT64)
            schema.add_field("record", DataType.VARCHAR, max_length=RECORD_CHARS)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=len(PLACEHOLDER))
            self._unless_made("creating the commit log", self.exists, lambda: client.create_collection(
                name, schema=schema, consistency_level="Strong", timeout=timeout))
        self._open()

    def _open(self) -> None:
        """Load the log (a restarted server holds it released), indexing it first if it has no
        index yet: making it is three requests (create, index, load), a writer may have stopped
        between them, and a Milvus server loads no collection without an index."""
        client, name, timeout = self.connection.client, self.connection.collection, self.connection.timeout_s
        if not self._indexed():
            index = client.prepare_index_params()
            index.add_index(field_name="vector", index_type="FLAT", metric_type="L2")
            self._unless_made("indexing the commit log", self._indexed,
                              lambda: client.create_index(name, index, timeout=timeout))
        open_collection(self.connection, f"lineage {self.lineage.collection!r}")
        self._opened = True

    def _unless_made(self, what: str, made: Callable[[], bool], make: Callable[[], object]) -> None:
        """``make()``; a refusal is no error once ``made()``: another writer (of another deployment
        sharing the lineage) made the same thing at the same moment."""
        try:
            with self.connection.calling(what):
                make()
        except MilvusStoreError:
            if not made():
                raise

    def _indexed(self) -> bool:
        with self.connection.calling("looking for the commit log's index"):
            return bool(self.connection.client.list_indexes(self.connection.collection, timeout=self.connection.timeout_s))


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
