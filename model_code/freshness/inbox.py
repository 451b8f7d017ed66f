"""The inbox of incoming document batches: a watched directory with a ledger.

Layout under ``Layout.inbox``::

    <file>.jsonl | <file>.parquet      dropped here, waiting (dot-files are ignored: write, then rename)
    accepted/<batch_id><suffix>        a copy of every valid batch, named by content hash, in ``ledger.jsonl`` order
    quarantine/<file> + <file>.error.json   files that cannot be parsed, hold no valid change, may not be
                                       opened, or are larger than ``data.max_batch_bytes``
    duplicates/<file>                  files whose content was received before (never applied twice)
    ledger.jsonl                       one line per accepted batch: id, sha256, name, counts
    reverted.jsonl                     batches taken out of the loop: ``excluded`` by a rollback or by
                                       ``fresh-registry exclude-batches`` (never applied again, left
                                       out of retrains), ``requeued`` by a rollback (applied again), or
                                       ``restored`` (served again: a rollback undone)

A batch is one immutable thing from the moment it is accepted: ``receive()`` first claims a
settled file (renames it to ``.claimed.<name>``, so whatever is written under its name from then
on is a new file that waits for its own turn), copies it into ``accepted/`` hashing the bytes it
copies, validates the copy, and the ledger names that hash and the document limits it was
validated with; a writer that keeps writing cannot change an accepted batch, and a later change
of ``data.*`` limits does not either. A file is *settled* when it is unchanged for
``settle_seconds``, held open for writing by no process on this host (Linux ``/proc``; checked
again once every settled file is claimed, for a writer that opened one in between, in one scan
before any is copied), and, for
JSONL, ends with a complete line (a file without its final newline waits ten times longer). One
receiver works at a time (a lock), so two sensor ticks never take the same file twice, and there
is one ledger line per content hash. Files are taken in the order they settled (last written,
then name): ``submit-documents new.jsonl fix.jsonl`` is accepted, and applied, as submitted. Order of the steps: claim, copy, validate, the copy moved
into ``accepted/``, the ledger line, the claimed file removed. A crash before the ledger line
leaves the claimed file, which the next ``receive`` takes first (a file dropped under its name
meanwhile waits a turn: claiming it would replace the one claimed); one after it leaves a claimed
file whose content the ledger holds, sorted into ``duplicates/``: an accepted batch is never lost
and never accepted twice. A file no reader can parse is quarantined, whatever the reader raises,
and so is one the receiver may not open, so it never blocks the ones after it; a failure of the
receiver's own file system (a full disk) leaves the file claimed for the next receive, never
quarantined; and nothing a user wrote is deleted before its content is in ``accepted/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from model_code.config import DataParams
from model_code.data.batches import DocumentBatch, describe_reject, read_document_batch
from model_code.data.tables import IngestError
from model_code.io import atomic_path, exclusive_lock, file_sha256, rename_no_replace

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".parquet")
INCOMPLETE_LINE_FACTOR = 10  # a JSONL file without its final newline waits this many settle intervals
CLAIMED = ".claimed."  # a waiting file being received is renamed to this prefix + its name


@dataclass(frozen=True)
class Batch:
    batch_id: str  # first 16 hex digits of the content hash: the Dagster partition key
    sha256: str
    name: str  # the file name it arrived with
    path: Path  # its accepted copy
    documents: int  # documents added or replaced
    rejected: int
    deleted: int = 0  # documents removed (ledgers written before deletions existed have none)
    limits: dict = field(default_factory=dict)  # the data.* document limits it was accepted under


class Inbox:
    def __init__(self, root: Path, settle_seconds: float = 1.0, data: DataParams | None = None):
        self.root = Path(root)
        self.data = data or DataParams()  # the document contract's limits (params.data)
        self.accepted_dir = self.root / "accepted"
        self.quarantine_dir = self.root / "quarantine"
        self.duplicates_dir = self.root / "duplicates"
        self.ledger_file = self.root / "ledger.jsonl"
        self.reverted_file = self.root / "reverted.jsonl"
        self.settle_seconds = settle_seconds  # a file modified more recently may still be being written

    # -- reading ------------------------------------------------------------------------------
    def batches(self) -> list[Batch]:
        """Every accepted batch, in arrival order."""
        if not self.ledger_file.exists():
            return []
        entries = [json.loads(line) for line in self.ledger_file.read_text().splitlines() if line.strip()]
        return [Batch(**{**e, "path": self.accepted_dir / e["path"]}) for e in entries]

    def batch(self, batch_id: str) -> Batch:
        for batch in self.batches():
            if batch.batch_id == batch_id:
                return batch
        raise KeyError(f"no accepted batch {batch_id!r} in {self.ledger_file}")

    def read(self, batch: Batch) -> DocumentBatch:
        """The changes an accepted batch holds, validated with the document limits it was accepted
        under (``data.*`` may have changed since: a batch stays what was accepted)."""
        return read_document_batch(batch.path, self.limits(batch), batch.name)

    def limits(self, batch: Batch) -> DataParams:
        """This inbox's data params with the document limits ``batch`` was accepted under."""
        return self.data.model_copy(update=batch.limits)

    def included(self) -> list[Batch]:
        """The accepted batches a full retrain ingests, read at one ledger position: all but those
        excluded. A retrain reads the documents of exactly this list and names it as what it
        includes, so a batch accepted meanwhile is never claimed without its documents."""
        excluded = self.excluded()
        return [b for b in self.batches() if b.sha256 not in excluded]

    def revert(self, sha256s: list[str], status: str, reason: str) -> list[dict]:
        """Record that these batches are taken out of the loop (``excluded``: by a rollback, or
        never served and excluded by hand), to be applied again (``requeued``), or back in the
        loop because the champion serves them again (``restored``: a rollback undone); the latest
        record of a batch is what holds."""
        if status not in ("excluded", "requeued", "restored"):
            raise ValueError(f"a reverted batch is excluded, requeued or restored, not {status!r}")
        records = [{"sha256": sha, "batch_id": sha[:16], "status": status, "reason": reason,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")} for sha in sha256s]
        self._append(self.reverted_file, records)
        return records

    def reverted(self) -> list[dict]:
        """Every rollback record, in order (``line`` numbers them: a requeue's run key)."""
        if not self.reverted_file.exists():
            return []
        lines = [line for line in self.reverted_file.read_text().splitlines() if line.strip()]
        return [{**json.loads(line), "line": number} for number, line in enumerate(lines, start=1)]

    def excluded(self) -> set[str]:
        """Content hashes of the batches whose latest rollback record excludes them."""
        latest = {r["sha256"]: r["status"] for r in self.reverted()}
        return {sha for sha, status in latest.items() if status == "excluded"}

    def pending(self) -> list[Path]:
        """The waiting files that are settled (see the module's docstring), in the order they settled."""
        if not self.root.is_dir():
            return []
        now = time.time()
        waiting = [p for p in self.root.iterdir() if p.is_file() and not p.name.startswith(".")
                   and p.name not in (self.ledger_file.name, self.reverted_file.name)]
        quiet = in_arrival_order(p for p in waiting if self._settled(p, now))
        writing = open_for_writing(quiet)
        return [p for p in quiet if p not in writing]

    def _settled(self, path: Path, now: float) -> bool:
        """Unchanged for its settle time. A file that cannot be opened (no read permission) is
        timed as one that ends with a complete line: ``receive`` then quarantines it, saying why."""
        try:
            stat = path.stat()  # the directory's entry: needs no permission on the file
        except FileNotFoundError:  # taken away meanwhile
            return False
        settle = self.settle_seconds
        if path.suffix == ".jsonl" and stat.st_size:
            try:
                with open(path, "rb") as handle:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":  # a line still being written, most likely
                        settle *= INCOMPLETE_LINE_FACTOR
            except FileNotFoundError:
                return False
            except PermissionError:
                pass
        return now - stat.st_mtime >= settle

    # -- receiving ----------------------------------------------------------------------------
    def receive(self) -> dict[str, list]:
        """Sort every settled waiting file into accepted / duplicates / quarantine; return what
        happened. One receiver at a time: a second one waits, then finds the files gone."""
        outcome: dict[str, list] = {"accepted": [], "duplicates": [], "quarantined": []}
        self.root.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.root / ".receive.lock"):
            for stale in self.accepted_dir.glob(".*"):  # the copy of a receiver that was killed
                stale.unlink()
            claimed = {path: path.name.removeprefix(CLAIMED)  # files a killed receiver had claimed, first
                       for path in in_arrival_order(self.root.glob(CLAIMED + "*"))}
            for path in self.pending():
                target = path.with_name(CLAIMED + path.name)
                if target in claimed:  # a claimed file of that name waits: a rename would replace it (lost)
                    continue
                try:
                    os.rename(path, target)
                except FileNotFoundError:  # taken away by someone else meanwhile: nothing to receive
                    continue
                claimed[target] = path.name
            # a writer that opened a file between the scan for writers and its claim writes on into the claimed
            # file: it waits until it settles. Checked once for all claimed files (a /proc scan reads every
            # process's descriptors), before any is copied: no writer can open a claimed name afterwards
            writing = open_for_writing(list(claimed))
            for path, name in claimed.items():
                if path in writing:
                    log.info("%s is still being written; it is taken once it settles", name)
                    self._unclaim(path, name)
                else:
                    self._take_or_leave(path, name, outcome)
        return outcome

    def _unclaim(self, claimed: Path, name: str) -> None:
        """Give the file back its name to wait for its turn (or, where a new file took the name
        meanwhile, leave it claimed: the next receive takes it first), never replacing a file a
        writer renamed to that name since it was looked at."""
        rename_no_replace(claimed, self.root / name)

    def _take_or_leave(self, claimed: Path, name: str, outcome: dict[str, list]) -> None:
        """``_take``, but a failure of the file system (a full disk, an I/O error) leaves the
        claimed file for the next ``receive`` and goes on with the others: no file blocks the
        files after it, and a batch is never quarantined for the receiver's own trouble."""
        try:
            self._take(claimed, name, outcome)
        except OSError as exc:
            log.error("%s not received this time, taken again at the next receive: %s", name, exc)

    def _take(self, claimed: Path, name: str, outcome: dict[str, list]) -> None:
        """Accept, quarantine or set aside the file dropped as ``name``, renamed to ``claimed``
        first: a file written under ``name`` from then on (a rename over it, an append that opens
        it again) is a new file that waits for its own turn, never lost with this one."""
        self.accepted_dir.mkdir(parents=True, exist_ok=True)
        copy = self.accepted_dir / f".{uuid.uuid4().hex}{claimed.suffix}"  # a dot-file: never mistaken for a batch
        try:
            before = claimed.stat()
            limit = self.data.max_batch_bytes
            if (size := batch_bytes(claimed, limit)) > limit:  # read whole, it could take the receiver's memory
                self._refuse(claimed, name, _too_large(name, size, limit), outcome)
                return
            try:
                source = open(claimed, "rb")  # noqa: SIM115 - copy_hashing closes it
            except PermissionError as exc:
                self._refuse(claimed, name, f"{name}: cannot be read ({exc.strerror}); give the receiver read "
                             "permission and drop it again", outcome)
                return
            digest = copy_hashing(source, copy)
            if _changed(before, claimed.stat()):  # written while it was copied: it waits until it settles
                log.info("%s is still being written; it is taken once it settles", name)
                self._unclaim(claimed, name)
                return
            ledger = {b.sha256: b for b in self.batches()}
            if digest in ledger:
                self._move(claimed, self.duplicates_dir, name)
                outcome["duplicates"].append(name)
                log.info("%s: same content as accepted batch %s; moved to %s", name, ledger[digest].batch_id,
                         self.duplicates_dir)
                return
            try:
                changes = read_document_batch(copy, self.data, name)
                _require_changes(Path(name), changes)
            except Exception as exc:  # noqa: BLE001 - whatever a file does to the reader, it must not block the inbox
                reason = str(exc) if isinstance(exc, IngestError) else f"{name}: unreadable ({type(exc).__name__}: {exc})"
                self._refuse(claimed, name, reason[:2000], outcome)
                return
            batch = self._accept(copy, digest, name, changes)
            claimed.unlink()
            outcome["accepted"].append(batch)
        finally:
            copy.unlink(missing_ok=True)

    def submit(self, source: Path) -> tuple[Path, DocumentBatch]:
        """Validate ``source`` and place a copy in the inbox atomically (``submit-documents``);
        return where it landed and what it holds (its rejected rows too). The copy is whole
        before it appears, so it is dated ``settle_seconds`` back: the next receive takes it."""
        source = Path(source)
        if source.suffix not in SUFFIXES:
            raise IngestError(f"{source}: batches are {' or '.join(SUFFIXES)} files")
        limit = self.data.max_batch_bytes
        if source.is_file() and (size := batch_bytes(source, limit)) > limit:
            raise IngestError(_too_large(str(source), size, limit))
        changes = read_document_batch(source, self.data)
        _require_changes(source, changes)
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.root / f".{uuid.uuid4().hex}.part"
        shutil.copyfile(source, temporary)
        settled = time.time() - self.settle_seconds  # complete before it is linked in: no need to wait for quiet
        os.utime(temporary, (settled, settled))
        names = [source.name, f"{source.stem}-{file_sha256(temporary)[:8]}{source.suffix}",
                 f"{source.stem}-{uuid.uuid4().hex[:8]}{source.suffix}"]
        try:
            for name in names:  # a link never replaces a file waiting under that name (another submit's)
                try:
                    os.link(temporary, self.root / name)
                    return self.root / name, changes
                except FileExistsError:
                    continue
            raise IngestError(f"{source}: the inbox holds files named {', '.join(names)} already")
        finally:
            temporary.unlink()

    def _refuse(self, claimed: Path, name: str, reason: str, outcome: dict[str, list]) -> None:
        self.quarantine(claimed, reason, name)
        outcome["quarantined"].append(name)

    def quarantine(self, path: Path, reason: str, name: str) -> Path:
        """Move the file dropped as ``name`` (now at ``path``) to ``quarantine/`` with its error,
        the error first: a receiver that cannot write it (a full disk) leaves the file where it was,
        so no file sits in quarantine without saying why."""
        target = self._free_name(self.quarantine_dir, name)
        report = {"file": name, "error": reason, "quarantined_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with atomic_path(self.quarantine_dir / f"{target.name}.error.json") as tmp:
            tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(path, target)
        log.warning("%s quarantined: %s", name, reason)
        return target

    def _accept(self, copy: Path, digest: str, name: str, changes: DocumentBatch) -> Batch:
        """Move the validated copy of ``name`` into ``accepted/``, then write its ledger line."""
        batch_id = digest[:16]
        accepted = self.accepted_dir / f"{batch_id}{copy.suffix}"
        entry = {"batch_id": batch_id, "sha256": digest, "name": name, "path": accepted.name,
                 "documents": len(changes.documents), "rejected": len(changes.rejects), "deleted": len(changes.deleted),
                 "limits": self.data.limits()}
        os.replace(copy, accepted)
        self._append(self.ledger_file, [entry])
        log.info("accepted %s as batch %s (%d documents, %d deletions, %d rejected rows)", name, batch_id,
                 len(changes.documents), len(changes.deleted), len(changes.rejects))
        for reject in changes.rejects:
            log.warning("batch %s: rejected %s", batch_id, describe_reject(reject))
        return Batch(**{**entry, "path": accepted})

    def _append(self, file: Path, records: list[dict]) -> None:
        """Add JSON lines to ``file`` atomically, under the inbox's lock: two writers (sensor
        ticks, a rollback) never drop each other's lines, and a kill leaves the old or new file."""
        with exclusive_lock(self.root / ".ledger.lock"):
            lines = file.read_text() if file.exists() else ""
            with atomic_path(file) as tmp:
                tmp.write_text(lines + "".join(json.dumps(r) + "\n" for r in records))

    def _move(self, path: Path, directory: Path, name: str) -> Path:
        target = self._free_name(directory, name)
        os.replace(path, target)
        return target

    @staticmethod
    def _free_name(directory: Path, name: str) -> Path:
        """``directory/name``, or, where a file of that name is kept already, a dated variant."""
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / name
        if target.exists():
            stem, suffix = os.path.splitext(name)
            target = directory / f"{stem}-{int(time.time() * 1000)}{suffix}"
        return target


def _require_changes(path: Path, changes: DocumentBatch) -> None:
    if changes.documents.empty and not changes.deleted:
        first = f"; first: {describe_reject(changes.rejects[0])}" if changes.rejects else ""
        raise IngestError(f"{path}: no valid document ({len(changes.rejects)} rows rejected{first})")


def in_arrival_order(paths) -> list[Path]:
    """``paths`` by when each was last written, then by name; one gone meanwhile is left out."""
    stamped = []
    for path in paths:
        try:
            stamped.append((path.stat().st_mtime_ns, path.name, path))
        except FileNotFoundError:
            continue
    return [path for _, _, path in sorted(stamped)]


def batch_bytes(path: Path, limit: int) -> int:
    """What reading the batch at ``path`` holds, counted up to just past ``limit``: its size, or for
    parquet, which compresses and shares repeated values, its columns decoded a slice at a time
    (only one slice in memory; a damaged file counts its size, and the reader refuses it)."""
    size = path.stat().st_size
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        decoded = 0
        try:
            for part in pq.ParquetFile(path).iter_batches(batch_size=1024):
                decoded += part.nbytes
                if decoded > limit:
                    break
        except Exception:  # noqa: BLE001 - a damaged file is quarantined by the reader, saying why
            return size
        size = max(size, decoded)
    return size


def _too_large(name: str, size: int, limit: int) -> str:
    return f"{name}: {size:,} bytes to read, more than data.max_batch_bytes ({limit:,}): split it into smaller batches"


def _changed(before: os.stat_result, after: os.stat_result) -> bool:
    return (before.st_size, before.st_mtime_ns, before.st_ino) != (after.st_size, after.st_mtime_ns, after.st_ino)


def copy_hashing(reader: BinaryIO, target: Path) -> str:
    """Copy what ``reader`` reads (closed after) to ``target`` (flushed to disk) and return the
    sha256 of the bytes copied: the hash names exactly what was kept, whatever happens to the
    source afterwards."""
    digest = hashlib.sha256()
    with reader, open(target, "wb") as writer:
        for chunk in iter(lambda: reader.read(1 << 20), b""):
            digest.update(chunk)
            writer.write(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return digest.hexdigest()


def open_for_writing(paths: list[Path]) -> set[Path]:
    """Those of ``paths`` that a process on this host holds open for writing, read from Linux's
    ``/proc`` (best effort: another host's writer, a process in another PID namespace such as a
    container, or one this user cannot inspect, is not seen; the settle time is the guard then).
    Empty where there is no ``/proc``."""
    if not paths or not Path("/proc/self/fdinfo").is_dir():
        return set()
    wanted = {}
    for path in paths:
        try:
            stat = path.stat()
        except FileNotFoundError:  # taken away meanwhile: nobody writes it here
            continue
        wanted[(stat.st_dev, stat.st_ino)] = path
    found: set[Path] = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            descriptors = list(fd_dir.iterdir())
        except OSError:  # a process that ended, or one we may not inspect
            continue
        for fd in descriptors:
            try:
                stat = fd.stat()  # follows the link to the open file
                if (stat.st_dev, stat.st_ino) in wanted:
                    flags = int((fd_dir.parent / "fdinfo" / fd.name).read_text().split("flags:")[1].split()[0], 8)
                    if flags & (os.O_WRONLY | os.O_RDWR):
                        found.add(wanted[(stat.st_dev, stat.st_ino)])
            except (OSError, IndexError, ValueError):  # closed meanwhile: the process's other files still count
                continue
    return found
