"""The champion on local disk, and batches applied to it: the deployment side of the freshness loop.

The model registry is the source of truth for what is deployed (its ``champion``). A full
training registers a version that starts a *lineage*; its encoder and retriever are downloaded
once to ``models/deployed/v<lineage>/`` (a ``Layout`` of their own), where the incremental updates
of that lineage are applied as retriever versions (``versions.apply``: validated, atomic,
versioned). Every update is then registered as a new model version and becomes the champion (on
Milvus it is committed to the collection, and served, just before: ``committed_champion``
registers a commit a stopped writer left unregistered).

What an update changes is the retriever kind's business; this module only checks out, locks,
applies and hands the result to the registry. One writer at a time: a lineage directory is
installed once, under a lock, and never replaced; writers (``apply_batch``) hold the deployments
lock from checkout to registration; readers (the drift report) load the champion's own retriever
version and move nothing; a registration names the version it wrote. The registry itself is an
interface (``ModelRegistry``): ``tracking.deployment.MlflowRegistry`` implements it over MLflow,
so this module imports no tracking backend.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from model_code.config import Params
from model_code.freshness import report
from model_code.freshness.inbox import Batch, Inbox
from model_code.freshness.report import UNRECORDED_PASSAGE_TEXT
from model_code.io import atomic_path, exclusive_lock, file_sha256
from model_code.layout import Layout
from model_code.retrievers.registry import MANIFEST
from model_code.versions import apply
from model_code.versions.chain import RetrieverVersions

log = logging.getLogger(__name__)
ARTIFACTS = ("encoder", "retriever")  # what a registered version holds, by Layout attribute


class NoChampionError(LookupError):
    """Nothing is deployed yet: run the full pipeline first."""


@dataclass(frozen=True)
class ChampionRef:
    """A registered version as the deployment needs it: its number and its tags."""

    version: str
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def lineage_root(self) -> str:
        return self.tags.get("lineage_root", self.version)

    @property
    def retriever_version(self) -> str:
        return self.tags.get("retriever_version", "base")

    @property
    def passage_text(self) -> str:
        """The form its documents were encoded from (``PASSAGE_TEXT``; one per lineage)."""
        return self.tags.get("passage_text", UNRECORDED_PASSAGE_TEXT)

    @property
    def encoder_fingerprint(self) -> str:
        """Which encoder made this version's vectors: one per lineage (updates keep the encoder)."""
        return f"lineage-v{self.lineage_root}"


class ModelRegistry(Protocol):
    def champion(self) -> ChampionRef:
        """The version the champion alias points at (``NoChampionError`` when none)."""

    def download(self, version: str, destination: Path) -> dict[str, Path]:
        """Download a version's artifacts under ``destination``; return where each one landed
        (``retriever``, and ``encoder`` for kinds that use one)."""

    def register_update(self, deployment: Layout, parent: ChampionRef, manifest: dict, drift: dict) -> dict:
        """Register the retriever version ``manifest`` names as the champion replacing ``parent``."""

    def version(self, version: str) -> ChampionRef:
        """Any registered version, with its tags."""

    def promote(self, version: str, reason: str) -> None:
        """Point the champion alias at ``version`` (tagging why)."""

    def register_commits(self, champion: ChampionRef) -> ChampionRef:
        """Register the updates committed after ``champion`` but not registered (a writer stopped
        in between; servers already serve them); return the champion then."""

    def retriever_versions(self, lineage_root: str) -> set[str]:
        """Every retriever version name lineage ``lineage_root`` has given an update, registered or
        only committed, whether or not this machine holds it."""


def committed_champion(registry: ModelRegistry) -> ChampionRef:
    """For writers, under the deployments lock: the champion, with any update committed after it
    registered first (what the servers following it serve)."""
    return registry.register_commits(registry.champion())


def installed(registry: ModelRegistry, layout: Layout, champion: ChampionRef) -> Layout:
    """The champion's lineage directory, downloaded once, holding the champion's own retriever
    version and the versions before it in its lineage (each downloaded from its registered version
    when this machine never wrote it: a new host, another run worker, a wiped disk; a delta needs
    the versions it applies to, the lineage's history needs their manifests). Concurrent first
    uses wait for one download (a lock of their own, so a writer holding the deployments lock can
    call this); an existing directory is never replaced, so its retriever versions are never lost."""
    deployment = Layout(layout.deployments / f"v{champion.lineage_root}")

    def missing_versions() -> list[ChampionRef]:
        """The champion and its ancestors whose retriever version is not on disk, newest first
        (versions are only ever written after their parent, so the walk stops at the first one present)."""
        missing, ref = [], champion
        while ref.retriever_version != "base" and not (deployment.retriever_versions / ref.retriever_version
                                                       / MANIFEST).is_file():
            missing.append(ref)
            ref = registry.version(ref.tags["parent_version"])
        return missing

    if not deployment.retriever.is_dir() or missing_versions():
        with exclusive_lock(layout.deployments / ".install.lock"):
            if not deployment.retriever.is_dir():
                _install(registry, champion.lineage_root, deployment)
            for ref in reversed(missing_versions()):  # oldest first: a crash leaves a prefix of the lineage
                _install_version(registry, ref, deployment.retriever_versions / ref.retriever_version)
    return deployment


def checkout(registry: ModelRegistry, layout: Layout) -> tuple[Layout, ChampionRef]:
    """For writers: the champion's deployment with its retriever version current."""
    current = committed_champion(registry)
    deployment = installed(registry, layout, current)
    RetrieverVersions(deployment).checkout(current.retriever_version)
    return deployment, current


def _install(registry: ModelRegistry, version: str, deployment: Layout) -> None:
    deployment.root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=deployment.root.parent) as tmp:
        local = registry.download(version, Path(tmp))
        with atomic_path(deployment.root) as out:
            (out / "models").mkdir(parents=True)
            for name in ARTIFACTS:
                if name in local:  # no encoder for kinds without one
                    os.replace(local[name], out / getattr(deployment, name).relative_to(deployment.root))
    log.info("deployed v%s to %s", version, deployment.root)


def _install_version(registry: ModelRegistry, champion: ChampionRef, version_dir: Path) -> None:
    """The retriever of an incremental version, from its own registered artifact."""
    version_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=version_dir.parent) as tmp:
        local = registry.download(champion.version, Path(tmp))
        with atomic_path(version_dir) as out:
            os.replace(local["retriever"], out)
    log.info("downloaded retriever version %s of v%s to %s", champion.retriever_version, champion.version, version_dir)


def apply_batch(
    registry: ModelRegistry,
    params: Params,
    layout: Layout,
    batch: Path,
    embeddings: tuple[dict[str, np.ndarray], str] | None = None,
    drift: dict[str, float] | None = None,
    queries: pd.DataFrame | None = None,
) -> dict:
    """Apply ``batch`` to the champion's retriever (an upsert: ``apply.upsert_documents``) and
    register the result as the new champion, after every earlier inbox batch the champion does not
    serve yet, oldest first: batches are served in ledger order whichever run comes first, and a
    retrain promoted without the batches accepted after its ingest gets them from the next update.
    ``embeddings`` (vectors by document id, and the fingerprint of the encoder that made them) and
    ``queries`` pass on the drift report's document embeddings and the batch's generated
    queries, so neither is computed twice; vectors made by another champion's encoder (a retrain
    was promoted after the report) are dropped and the documents encoded again.

    Serialised by a lock on the deployments directory; on any failure before the registry moves
    the champion, the previous champion (and its retriever version) keeps serving."""
    with exclusive_lock(layout.deployments / ".lock"):  # rollbacks and exclusions take the same lock
        digest = file_sha256(batch)
        inbox = Inbox(layout.inbox, data=params.data)
        if digest in inbox.excluded():
            return {"status": "skipped", "reason": "batch excluded (see inbox/reverted.jsonl)"}
        deployment, parent = checkout(registry, layout)
        served = served_batches(registry, parent)
        if digest[:16] in served:  # e.g. ingested by the retrain it serves
            return {"status": "skipped", "reason": f"batch already served by champion v{parent.version}"}
        accepted = next((b for b in inbox.batches() if b.sha256 == digest), None)  # None: a file applied by hand
        caught_up = []
        for earlier in unserved_before(inbox, served, accepted):
            try:
                parent = _apply_one(registry, as_accepted(params, inbox, earlier), deployment, parent, earlier.path,
                                    stored_embeddings(layout, earlier.batch_id))[1]
            except Exception as exc:
                raise RuntimeError(f"batch {earlier.batch_id}, before {digest[:16]} in the ledger, could not be applied "
                                   f"({type(exc).__name__}: {exc}); batches are served in ledger order: fix it, or "
                                   f"take it out with fresh-registry exclude-batches {earlier.batch_id}") from exc
            caught_up.append(earlier.batch_id)
        settings = as_accepted(params, inbox, accepted) if accepted else params
        manifest, _, result = _apply_one(registry, settings, deployment, parent, batch, embeddings, drift, queries)
    if manifest.get("status") == "skipped":
        return manifest
    return {**manifest, "retriever_version": manifest["version"], **result, "caught_up": caught_up}


def unserved_before(inbox: Inbox, served: dict[str, str | None], batch: Batch | None) -> list[Batch]:
    """The included batches before ``batch`` in the ledger that are not served (none for a file
    that is not in the ledger, or an excluded one)."""
    ledger = inbox.included()
    return [] if batch not in ledger else [b for b in ledger[:ledger.index(batch)] if b.batch_id not in served]


def as_accepted(params: Params, inbox: Inbox, batch: Batch) -> Params:
    """``params`` with the document limits ``batch`` was accepted under (a batch is applied as it
    was accepted, whatever ``data.*`` says by now)."""
    return params.model_copy(update={"data": inbox.limits(batch)})


def stored_embeddings(layout: Layout, batch_id: str) -> tuple[dict[str, np.ndarray], str] | None:
    """A batch's document vectors from its drift report, when it has one."""
    out = layout.drift_reports / batch_id
    return report.load_embeddings(out) if (out / "embeddings.npz").is_file() else None


def _apply_one(registry: ModelRegistry, params: Params, deployment: Layout, parent: ChampionRef, batch: Path,
               embeddings: tuple[dict[str, np.ndarray], str] | None, drift: dict[str, float] | None = None,
               queries: pd.DataFrame | None = None) -> tuple[dict, ChampionRef, dict]:
    """One batch on ``parent``'s retriever version, registered as champion: (the update's
    manifest, the new champion, what the registry said)."""
    vectors, fingerprint = embeddings or (None, "")
    if vectors is not None and fingerprint != parent.encoder_fingerprint:
        log.info("batch vectors come from %s, the champion's encoder is %s: encoding again",
                 fingerprint or "an unknown encoder", parent.encoder_fingerprint)
        vectors = None
    # from the champion's own version, whatever a stray checkout did to the CURRENT pointer, named
    # after every version of the lineage: one a rollback left behind may be on another host only
    manifest = apply.upsert_documents(deployment, params, batch, vectors, queries, base=parent.retriever_version,
                                      taken=registry.retriever_versions(parent.lineage_root))
    if manifest.get("status") == "skipped":  # its chain of versions holds it already
        return manifest, parent, {}
    result = registry.register_update(deployment, parent, manifest, drift or {})
    return manifest, registry.version(str(result["registered_version"])), result


def served_batches(registry: ModelRegistry, version: ChampionRef) -> dict[str, str | None]:
    """The inbox batches ``version`` serves, oldest first, by batch id (with the content hash when
    the registry knows it): those its chain of incremental updates added, and those the full
    training it started from ingested (tag ``included_batches``)."""
    added = []
    while version.tags.get("update") == "incremental":
        added.append((version.tags["batch_sha256"][:16], version.tags["batch_sha256"]))
        version = registry.version(version.tags["parent_version"])
    included = [(batch, None) for batch in version.tags.get("included_batches", "").split(",") if batch]
    return dict(included + added[::-1])


def rollback(registry: ModelRegistry, layout: Layout, to_version: str | None = None, requeue: bool = False) -> dict:
    """Move the champion back (to ``to_version``, default: the version the champion replaced) and
    say what that did: the batches the champion served and the target does not are recorded in
    the inbox as ``excluded`` (default: never applied again, left out of retrains, for a bad
    batch) or ``requeued`` (``requeue``: the inbox sensor runs them again against the new
    champion, for a bad update of a good batch); excluded batches the target serves (a rollback
    undone) are ``restored``: in the loop again, and in retrains."""
    with exclusive_lock(layout.deployments / ".lock"):
        current = committed_champion(registry)
        target = to_version or current.tags.get("replaced_champion")
        if target is None:
            raise ValueError(f"champion v{current.version} replaced no earlier champion; pass a version")
        kept = served_batches(registry, registry.version(str(target)))
        inbox = Inbox(layout.inbox)
        ledger = {b.batch_id: b.sha256 for b in inbox.batches()}
        reverted = [sha or ledger[batch] for batch, sha in served_batches(registry, current).items()
                    if batch not in kept and (sha or batch in ledger)]
        status = "requeued" if requeue else "excluded"
        inbox.revert(reverted, status, f"rollback from v{current.version} to v{target}")
        # a rollback undone (``--to`` the version rolled back from) serves batches the first one excluded
        excluded = inbox.excluded()
        restored = [sha for sha in (sha or ledger.get(batch) for batch, sha in kept.items()) if sha in excluded]
        inbox.revert(restored, "restored", f"served again by v{target} (rollback from v{current.version})")
        try:
            registry.promote(str(target), f"rollback from v{current.version}")
        except Exception as exc:  # the champion did not move: its batches are served, as before (a kill here is not
            # undone: the next rollback's records, or exclude-batches, set them right)
            failed = f"rollback from v{current.version} to v{target} failed: {type(exc).__name__}"
            inbox.revert(reverted, "restored", failed)
            inbox.revert(restored, "excluded", failed)
            raise
    log.info("champion moved from v%s back to v%s; %d batch(es) %s, %d served again", current.version, target,
             len(reverted), status, len(restored))
    return {"from_version": int(current.version), "to_version": int(target), "reverted_batches": [s[:16] for s in reverted],
            "reverted_as": status, "restored_batches": [s[:16] for s in restored]}


def exclude_batches(registry: ModelRegistry, layout: Layout, batch_ids: list[str], reason: str) -> list[dict]:
    """Take accepted batches the champion does not serve out of the loop (``excluded``: never
    applied, left out of retrains), e.g. one whose update keeps failing and holds back the batches
    after it. A served batch is refused: a rollback takes it out of the champion."""
    with exclusive_lock(layout.deployments / ".lock"):
        inbox = Inbox(layout.inbox)
        ledger = {b.batch_id: b for b in inbox.batches()}
        unknown = [b for b in batch_ids if b not in ledger]
        if unknown:
            raise ValueError(f"not accepted batches: {', '.join(unknown)} (see {inbox.ledger_file})")
        try:
            champion = committed_champion(registry)
            served = served_batches(registry, champion)
        except NoChampionError:
            champion, served = None, {}
        serving = [b for b in batch_ids if b in served]
        if serving:
            raise ValueError(f"champion v{champion.version} serves {', '.join(serving)}: take them out with "
                             "fresh-registry rollback --to <a version before them>")
        return inbox.revert([ledger[b].sha256 for b in batch_ids], "excluded", reason)
