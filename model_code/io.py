"""Atomic file and directory writes, and content hashes.

Stages never write in place: they build their output in a temporary sibling, flush it to disk
(fsync of every file and directory) and move it into position, so a crash leaves either the
previous artifact or the new one, never a half-written file that a downstream stage (or DVC)
would pick up. A file moves with ``os.replace``. A directory that already exists is swapped with
the new one in a single step (Linux ``renameat2(RENAME_EXCHANGE)``), so a reader or a ``kill -9``
never finds the path missing; where the file system cannot exchange, two renames are the fallback.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)

_AT_FDCWD, _RENAME_NOREPLACE, _RENAME_EXCHANGE = -100, 1, 2
_CANNOT = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)  # the kernel, libc or file system has no such rename


def _renameat2(a: Path, b: Path, flags: int) -> int:
    """Linux ``renameat2``: 0 when done, else its errno (ENOSYS where libc lacks it)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return errno.ENOSYS
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return 0 if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0 else ctypes.get_errno()


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where the kernel or file system cannot."""
    code = _renameat2(a, b, _RENAME_EXCHANGE)
    if code in _CANNOT:
        return False
    if code:
        raise OSError(code, os.strerror(code), str(b))
    return True


def rename_no_replace(source: Path, target: Path) -> bool:
    """Rename ``source`` to ``target`` unless ``target`` exists (then False), in one step
    (``renameat2(RENAME_NOREPLACE)``): a file another process renames to ``target`` meanwhile is
    never replaced. Where the file system cannot, a check then a rename (a moment's window). Unlike
    a hard link, it needs no ownership of the file (``fs.protected_hardlinks``)."""
    code = _renameat2(source, target, _RENAME_NOREPLACE)
    if code in _CANNOT:
        if os.path.lexists(target):
            return False
        os.rename(source, target)
        return True
    if code == errno.EEXIST:
        return False
    if code:
        raise OSError(code, os.strerror(code), str(target))
    return True


def _fsync(path: Path) -> None:
    """Flush one file, or one directory's entries (a rename in it), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(path: Path) -> None:
    """Flush a written file, or every file and directory under a written directory."""
    for item in [path] if path.is_file() else [*sorted(path.rglob("*")), path]:
        _fsync(item)


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
        _fsync_tree(tmp)
        if target.is_dir() and not target.is_symlink():
            if not _exchange(tmp, target):  # os.replace cannot replace a non-empty directory
                os.replace(target, tmp_dir / f"{target.name}.old")
                os.replace(tmp, target)
        else:
            os.replace(tmp, target)
        _fsync(target.parent)  # the rename itself
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
def exclusive_lock(path: str | Path, waiting: str | None = None) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if absent): updates of one
    deployment are applied one after the other, whoever starts them (sensor, CLI, a test).
    ``waiting``: logged when another holder makes this one wait (a wait that may be long)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (fcntl.LOCK_NB if waiting else 0))
        except BlockingIOError:
            log.info("%s", waiting)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
