"""The registry of retriever kinds, and the self-describing directory every retriever is saved as.

A kind is a ``Retriever`` subclass registered with ``@register``. Stages, the CLI, the MLflow
pyfunc and the freshness loop only ever call ``kind_class(name)``, ``load_retriever(dir)`` and the
contract's methods, so a new retrieval method is one module here (or a class registered from a
user's own code) and nothing else changes.

A saved retriever is a directory with ``manifest.json`` naming its kind and its files (plus what
the kind recorded to load itself again); ``load_retriever`` reads the kind from it, so a directory
can be loaded without knowing how it was configured. A *delta* directory (``save_delta``, manifest
``"delta": true``) holds only what one update changed; ``load_chain`` loads a whole copy and
replays the deltas made after it, in order. Beside the kind's files a directory may hold the text of
its documents (``versions.documents``, passed as ``store``), saved whole or as a delta with it.

This module imports no kind: ``import model_code.retrievers`` registers the built-in ones, and
``kind_class`` does that import on first use (``config.py`` validates ``retriever.kind`` through
it without importing every kind at load time).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from model_code.retrievers.base import Retriever
    from model_code.versions.documents import DocumentStore

MANIFEST = "manifest.json"
_KINDS: dict[str, type[Retriever]] = {}
K = TypeVar("K", bound="type[Retriever]")


def register(cls: K) -> K:
    """Class decorator: make ``cls`` available as ``retriever.kind: <cls.kind>``."""
    name = getattr(cls, "kind", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"{cls.__name__}.kind must be an identifier string, got {name!r}")
    existing = _KINDS.get(name)
    if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"retriever kind {name!r} is already registered by {existing.__module__}.{existing.__qualname__}")
    _KINDS[name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a kind registered for a while (a plugin tried in a notebook, a test's own kind)."""
    _KINDS.pop(name, None)


def _load_builtin_kinds() -> None:
    importlib.import_module("model_code.retrievers")


def kind_names() -> list[str]:
    _load_builtin_kinds()
    return sorted(_KINDS)


def kind_class(name: str) -> type[Retriever]:
    _load_builtin_kinds()
    if name not in _KINDS:
        raise ValueError(f"unknown retriever kind {name!r}: registered kinds are {', '.join(sorted(_KINDS))}")
    return _KINDS[name]


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {MANIFEST}, so not a saved retriever (run the index stage first)")
    manifest = json.loads(path.read_text())
    if "kind" not in manifest:
        raise ValueError(f"{path}: no 'kind' field; the directory was written by an older version, rebuild it")
    return manifest


def save_retriever(retriever: Retriever, directory: str | Path, store: DocumentStore | None = None,
                   **info: Any) -> dict[str, Any]:
    """Write ``retriever`` (and the text of its documents, ``store``) into the (new, empty)
    ``directory`` with its manifest; ``info`` is extra manifest content (build timings, version
    bookkeeping). Returns the manifest."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if store is not None:
        store.save(directory)
    return _write_manifest(retriever, directory, {**info, **retriever.save_files(directory)})


def save_retriever_delta(retriever: Retriever, directory: str | Path, store: DocumentStore | None = None,
                         **info: Any) -> dict[str, Any] | None:
    """Write what changed in ``retriever`` (and in ``store``) since it was loaded into the (new,
    empty) ``directory`` with its manifest, or return None, writing nothing, when its kind stores
    whole versions only."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    recorded = retriever.save_delta(directory)
    if recorded is None:
        return None
    if store is not None:
        store.save_delta(directory)
    return _write_manifest(retriever, directory, {**info, **recorded, "delta": True})


def _write_manifest(retriever: Retriever, directory: Path, content: dict[str, Any]) -> dict[str, Any]:
    """The manifest of the files just written into ``directory``: ``content``, the kind, the
    files and the number of documents."""
    files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {**content, "kind": retriever.kind, "files": files, "documents": len(retriever.live_ids())}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return manifest


def _complete_manifest(directory: Path) -> dict[str, Any]:
    manifest = read_manifest(directory)
    missing = [f for f in manifest.get("files", []) if not (directory / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory}: {len(missing)} file(s) of the {manifest['kind']} retriever are missing, "
                                f"e.g. {missing[0]}")
    return manifest


def _checked_manifest(directory: Path, encoder_dir: str | Path | None) -> dict[str, Any]:
    manifest = _complete_manifest(directory)
    if kind_class(manifest["kind"]).uses_encoder and encoder_dir is None:
        raise ValueError(f"the {manifest['kind']} retriever in {directory} needs its encoder directory")
    return manifest


def load_retriever(directory: str | Path, encoder_dir: str | Path | None = None) -> Retriever:
    """The retriever saved whole in ``directory``; ``encoder_dir`` is the trained encoder that kinds
    with a neural query or document side use (it is shared by every version, not copied)."""
    directory = Path(directory)
    manifest = _checked_manifest(directory, encoder_dir)
    if manifest.get("delta"):
        raise ValueError(f"{directory} holds only the changes made to version {manifest.get('delta_of', '?')}; "
                         "load it after that version (RetrieverVersions.load_version, or load_chain)")
    return kind_class(manifest["kind"]).load_files(directory, manifest, Path(encoder_dir) if encoder_dir else None)


def load_chain(directories: list[Path], encoder_dir: str | Path | None = None) -> Retriever:
    """The retriever a whole copy (``directories[0]``) followed by the deltas saved after it
    describe, each applied to the result of the ones before."""
    retriever = load_retriever(directories[0], encoder_dir)
    apply_deltas(retriever, directories[1:])
    return retriever


def apply_deltas(retriever: Retriever, directories: list[Path]) -> None:
    """Replay saved deltas on ``retriever`` (loaded already, with its encoder), in order, each on
    the result of the ones before: what a served model does to follow its lineage's updates."""
    for directory in directories:
        manifest = _complete_manifest(Path(directory))
        if not manifest.get("delta") or manifest["kind"] != retriever.kind:
            raise ValueError(f"{directory}: not a delta of a {retriever.kind} retriever")
        retriever.apply_delta(Path(directory), manifest)
