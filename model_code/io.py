"""Atomic file and directory writes, and content hashes.

Stages never write in place: they build their output in a temporary sibling and move it into
position with ``os.replace``, so a crash leaves either the previous artifact or the new one,
never a half-written file that a downstream stage (or DVC) would pick up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``target`` (file or directory) into; replace it on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp = tmp_dir / target.name
    try:
        yield tmp
        if not tmp.exists():
            raise RuntimeError(f"nothing was written for {target}")
        if target.is_dir() and not target.is_symlink():
            # os.replace cannot replace a non-empty directory: swap via a second rename.
            old = tmp_dir / f"{target.name}.old"
            os.replace(target, old)
            os.replace(tmp, target)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def write_json(path: str | Path, data: Any) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return Path(path)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def write_parquet(path: str | Path, frame: pd.DataFrame) -> Path:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
    return Path(path)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_sha256(path: str | Path) -> str:
    """Content hash of a file or of every file under a directory (names included)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode())
        digest.update(file_sha256(file).encode())
    return digest.hexdigest()


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if absent): updates of one
    deployment are applied one after the other, whoever starts them (sensor, CLI, a test)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
