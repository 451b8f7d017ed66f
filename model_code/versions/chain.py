"""The chain of a workspace's (or deployment's) retriever versions: ``base``, vNNNN, ``CURRENT``.

Before the first update the index stage's own retriever (``models/retriever``, "base") is
current. Each committed update is a new version under ``models/retriever_versions/vNNNN``
(its manifest, its rejects, and what the update changed: the kind's delta, or the whole
retriever every ``freshness.full_copy_every`` versions and for kinds without deltas, with the
text of its documents beside it, ``versions.documents``), and only then does the ``CURRENT``
pointer move, with ``os.replace``: a crash leaves ``CURRENT`` on the previous version, which
stays loadable. A version loads from the last whole copy at or before it and the deltas after
that copy (``RetrieverVersions.chain``). Writers hold ``versions_lock`` from loading their base
to committing, so two at once never branch from the same version; what a writer does in between
(applying a batch of documents) is ``versions.apply``.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from model_code.io import atomic_path, exclusive_lock
from model_code.layout import Layout
from model_code.retrievers import Retriever, load_chain, read_manifest, save_retriever, save_retriever_delta
from model_code.versions.documents import DocumentStore


class RetrieverVersions:
    """The versions of one workspace's retriever: ``base`` (the index stage's) and vNNNN."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.root = layout.retriever_versions
        self.base = layout.retriever

    @property
    def current_name(self) -> str:
        pointer = self.root / "CURRENT"
        return pointer.read_text().strip() if pointer.exists() else "base"

    def current_dir(self) -> Path:
        return self.version_dir(self.current_name)

    def version_dir(self, name: str) -> Path:
        return self.base if name == "base" else self.root / name

    def load(self) -> Retriever:
        return self.load_version(self.current_name)

    def load_version(self, name: str) -> Retriever:
        return load_chain(self.chain(name), self.layout.encoder)

    def load_documents(self, name: str) -> DocumentStore | None:
        """The text of the documents version ``name`` holds (None: saved before versions kept it)."""
        return DocumentStore.load_chain(self.chain(name))

    def chain(self, name: str) -> list[Path]:
        """The directories that load version ``name``: the last whole copy at or before it, then
        the deltas after that copy, oldest first."""
        directories = [self.version_dir(name)]
        manifest = read_manifest(directories[0])
        while manifest.get("delta"):
            directories.append(self.version_dir(manifest["delta_of"]))
            manifest = read_manifest(directories[-1])
        return directories[::-1]

    def checkout(self, name: str) -> None:
        """Make an existing version (or ``base``) current, e.g. after a registry rollback."""
        if name != self.current_name:
            if name != "base" and not (self.root / name / "manifest.json").is_file():
                raise FileNotFoundError(f"{self.root / name}: no such retriever version")
            with atomic_path(self.root / "CURRENT") as pointer:
                pointer.write_text(name + "\n")

    def manifests(self, version: str | None = None) -> list[dict]:
        """Manifests of the versions from ``base`` (excluded) to ``version`` (default: the current
        one): the lineage that version holds."""
        chain, name = [], version or self.current_name
        while name != "base":
            manifest = read_manifest(self.root / name)
            chain.append(manifest)
            name = manifest["parent"]
        return chain[::-1]

    def applied_batches(self, version: str | None = None) -> set[str]:
        """Content hashes of the batches ``version`` (default: the current one) holds (a batch is
        never applied twice; one whose version was abandoned, e.g. by a rollback or a failed
        registration, may be)."""
        return {m.get("batch_sha256") for m in self.manifests(version)} - {None}

    def commit(self, retriever: Retriever, documents: DocumentStore | None, manifest: dict, rejects: list[dict],
               full_copy_every: int, parent: str | None = None, taken: Collection[str] = ()) -> str:
        """Save ``retriever`` and its ``documents``, loaded from version ``parent`` (default: the
        current one) and changed since, as the next version: their deltas, or whole copies when the
        chain of deltas would reach ``full_copy_every`` or the kind keeps none; then make it current.

        It is named after every version here and in ``taken``: a deployment's versions are also
        written on other hosts (or before its directory was wiped), and a rollback leaves later
        ones off this host's disk; a name given twice would make two updates one to whoever
        follows the lineage by name (a server still on the first would call itself the second)."""
        parent = parent or self.current_name
        names = [p.name for p in self.root.glob("v[0-9]*")] + list(taken)
        numbers = [int(name[1:]) for name in names if name[:1] == "v" and name[1:].isdigit()]
        name = f"v{max(numbers, default=0) + 1:04d}"  # by number: as text, v10000 sorts before v9999
        info = {**manifest, "version": name, "parent": parent}
        with atomic_path(self.root / name) as out:
            as_delta = len(self.chain(parent)) < full_copy_every  # the chain's whole copy + its deltas, then this
            if not (as_delta and save_retriever_delta(retriever, out, store=documents, **info, delta_of=parent)):
                save_retriever(retriever, out, store=documents, **info)
            (out / "rejects.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rejects))
        with atomic_path(self.root / "CURRENT") as pointer:
            pointer.write_text(name + "\n")
        return name


def versions_lock(layout: Layout):
    """The lock every writer of ``layout``'s retriever versions holds from reading its base
    version to committing the next one: two updates at once (two ``add-documents``, a CLI edit
    during a sensor's update) run one after the other, each on the other's result."""
    return exclusive_lock(layout.retriever_versions.parent / ".versions.lock")
