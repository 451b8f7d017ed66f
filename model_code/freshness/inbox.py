"""The inbox of incoming document batches: a watched directory with a ledger.

Layout under ``Layout.inbox``::

    <file>.jsonl | <file>.parquet      dropped here, waiting (dot-files are ignored: write, then rename)
    accepted/<batch_id><suffix>        every valid batch, named by content hash, in ``ledger.jsonl`` order
    quarantine/<file> + <file>.error.json   files that cannot be parsed or hold no valid document
    duplicates/<file>                  files whose content was received before (never applied twice)
    ledger.jsonl                       one line per accepted batch: id, sha256, name, time, counts
    reverted.jsonl                     batches a rollback took out of the champion: excluded (never
                                       applied again, left out of retrains) or requeued (applied again)

``receive()`` is cheap (hash + parse + validate of small files) so the Dagster sensor can call it;
nothing is ever deleted, and a malformed file never blocks the ones after it. The ledger line is
written (atomically, under a lock) *before* the file leaves the inbox, and the move is
``os.replace`` within one file system: a crash between the two leaves the file waiting with its
ledger line, and the next ``receive`` finishes the move. So an accepted batch is never lost and
never accepted twice.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from model_code.config import DataParams
from model_code.data.batches import read_document_batch
from model_code.data.tables import IngestError
from model_code.io import atomic_path, exclusive_lock, file_sha256

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class Batch:
    batch_id: str  # first 16 hex digits of the content hash: the Dagster partition key
    sha256: str
    name: str  # the file name it arrived with
    path: Path  # its accepted copy
    documents: int
    rejected: int


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

    def documents(self) -> pd.DataFrame:
        """The valid documents of every ``included`` batch, for a full retrain."""
        frames = [read_document_batch(b.path, self.data)[0] for b in self.included()]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def included(self) -> list[Batch]:
        """The accepted batches a full retrain ingests: all but those a rollback excluded."""
        excluded = self.excluded()
        return [b for b in self.batches() if b.sha256 not in excluded]

    def revert(self, sha256s: list[str], status: str, reason: str) -> list[dict]:
        """Record that a rollback took these batches out of the champion, as ``excluded`` or
        ``requeued``; the latest record of a batch is what holds."""
        if status not in ("excluded", "requeued"):
            raise ValueError(f"a reverted batch is excluded or requeued, not {status!r}")
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
        if not self.root.is_dir():
            return []
        now = time.time()
        return sorted(
            p for p in self.root.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.name not in (self.ledger_file.name, self.reverted_file.name)
            and now - p.stat().st_mtime >= self.settle_seconds
        )

    # -- receiving ----------------------------------------------------------------------------
    def receive(self) -> dict[str, list]:
        """Sort every waiting file into accepted / duplicates / quarantine; return what happened."""
        outcome: dict[str, list] = {"accepted": [], "duplicates": [], "quarantined": []}
        ledger = {b.sha256: b for b in self.batches()}
        known = set(ledger)
        for path in self.pending():
            digest = file_sha256(path)
            if digest in ledger and not ledger[digest].path.exists():  # a crash between ledger and move
                self.accepted_dir.mkdir(parents=True, exist_ok=True)
                os.replace(path, ledger[digest].path)
                log.info("%s: finished accepting batch %s after an interruption", path.name, ledger[digest].batch_id)
                continue
            if digest in known:
                self._move(path, self.duplicates_dir)
                outcome["duplicates"].append(path.name)
                log.info("%s: same content as an accepted batch; moved to %s", path.name, self.duplicates_dir)
                continue
            try:
                batch = self._accept(path, digest)
            except (IngestError, ValueError, OSError) as exc:
                self.quarantine(path, str(exc))
                outcome["quarantined"].append(path.name)
                continue
            known.add(digest)
            outcome["accepted"].append(batch)
        return outcome

    def submit(self, source: Path) -> Path:
        """Validate ``source`` and place a copy in the inbox atomically (``submit-documents``)."""
        source = Path(source)
        if source.suffix not in SUFFIXES:
            raise IngestError(f"{source}: batches are {' or '.join(SUFFIXES)} files")
        documents, rejects = read_document_batch(source, self.data)
        if documents.empty:
            raise IngestError(f"{source}: no valid document ({len(rejects)} rows rejected: {rejects[:1]})")
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.root / f".{source.name}.part"
        shutil.copyfile(source, temporary)
        target = self.root / source.name
        if target.exists():
            target = self.root / f"{source.stem}-{file_sha256(temporary)[:8]}{source.suffix}"
        os.replace(temporary, target)
        return target

    def quarantine(self, path: Path, reason: str) -> Path:
        target = self._move(path, self.quarantine_dir)
        report = {"file": path.name, "error": reason, "quarantined_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (self.quarantine_dir / f"{target.name}.error.json").write_text(json.dumps(report, indent=2) + "\n")
        log.warning("%s quarantined: %s", path.name, reason)
        return target

    def _accept(self, path: Path, digest: str) -> Batch:
        if path.suffix not in SUFFIXES:
            raise IngestError(f"{path.name}: batches are {' or '.join(SUFFIXES)} files")
        documents, rejects = read_document_batch(path, self.data)
        if documents.empty:
            first = rejects[0]["reason"] if rejects else "empty file"
            raise IngestError(f"{path.name}: no valid document ({len(rejects)} rows rejected; first: {first})")
        batch_id = digest[:16]
        self.accepted_dir.mkdir(parents=True, exist_ok=True)
        accepted = self.accepted_dir / f"{batch_id}{path.suffix}"
        entry = {"batch_id": batch_id, "sha256": digest, "name": path.name, "path": accepted.name,
                 "documents": len(documents), "rejected": len(rejects)}
        self._append(self.ledger_file, [entry])
        os.replace(path, accepted)
        log.info("accepted %s as batch %s (%d documents, %d rejected rows)", path.name, batch_id,
                 len(documents), len(rejects))
        return Batch(**{**entry, "path": accepted})

    def _append(self, file: Path, records: list[dict]) -> None:
        """Add JSON lines to ``file`` atomically, under the inbox's lock: two writers (sensor
        ticks, a rollback) never drop each other's lines, and a kill leaves the old or new file."""
        with exclusive_lock(self.root / ".ledger.lock"):
            lines = file.read_text() if file.exists() else ""
            with atomic_path(file) as tmp:
                tmp.write_text(lines + "".join(json.dumps(r) + "\n" for r in records))

    def _move(self, path: Path, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / path.name
        if target.exists():
            target = directory / f"{path.stem}-{int(time.time() * 1000)}{path.suffix}"
        os.replace(path, target)
        return target
