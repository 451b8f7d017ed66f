"""The served retriever follows a registry alias: a running endpoint serves each new champion
without a restart and without a failed request.

``fresh-registry serve`` starts ``mlflow models serve`` on ``models:/<name>@<serve.follow>`` with
``FRESH_SERVE_MODEL`` (the registered model's name) and ``FRESH_SERVE_FOLLOW`` (the alias) in its
environment; the pyfunc then polls the alias every ``serve.refresh_seconds`` in a background
thread of each worker. A server started without ``FRESH_SERVE_FOLLOW`` (``--version N``, or
``mlflow models serve`` by hand) stays on the version it loaded.

When the alias moves to a later version of the served lineage whose updates are all deltas, the
deltas are replayed in place, oldest first (kilobytes of rows, no reload of the encoder or the
base index), while searches wait on a lock for the few milliseconds each takes. Otherwise (a
promoted retrain, a rollback, a whole copy in the chain) the target version is loaded beside the
served one and swapped in with one assignment: a request in flight finishes on the version it
started with, whose memory is freed once the last one ends. Either way a query is answered by
one version's encoder and index together, and every answer names that version.

On Milvus (``index.backend: milvus``) an update is served before its version is registered: the
follower also reads the served lineage's commit log (``model_code/stores/milvus_commits.py``) and
replays each commit that extends what it serves, the same way, answering as ``N+vNNNN``; when
version N+1 registers that commit, the answers are named ``N+1`` and nothing is reloaded. A
commit a rollback revoked is no longer served: the registered version is loaded again.

A request is checked against the limits of the version that answers it (``serve.max_k`` and
``serve.max_queries``, logged with each version in ``serve.json``): a retrain or an update logged
with other limits brings them with it; a commit served before its version registers keeps the
served version's. ``serve.follow`` and ``serve.refresh_seconds`` say how the server runs: read
once, at its start, from ``params.yaml`` by ``fresh-registry serve`` (the loaded version's
``serve.refresh_seconds`` where ``FRESH_SERVE_REFRESH_SECONDS`` is unset).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode
from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

if TYPE_CHECKING:
    from model_code.config import ServeParams
    from model_code.retrievers import Retriever
    from model_code.stores.milvus_commits import CommitLog
    from model_code.versions.documents import DocumentStore

log = logging.getLogger(__name__)
MODEL_ENV, FOLLOW_ENV, REFRESH_ENV = "FRESH_SERVE_MODEL", "FRESH_SERVE_FOLLOW", "FRESH_SERVE_REFRESH_SECONDS"


class SharedLock:
    """Many readers (searches) or one writer (a delta being replayed); a waiting writer holds
    back new readers, so a steady stream of searches cannot postpone an update for ever."""

    def __init__(self):
        self._condition = threading.Condition()
        self._readers, self._writer, self._waiting = 0, False, 0

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: not self._writer and not self._waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._condition:
                self._readers -= 1
                self._condition.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._condition:
            self._waiting += 1
            self._condition.wait_for(lambda: not self._writer and not self._readers)
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._condition:
                self._writer = False
                self._condition.notify_all()


WARM_UP_QUERY = "warm up"


@dataclass
class ServedVersion:
    """What a server answers from: a registered version (``registered``), extended by the updates
    committed after it (``index.backend: milvus``) up to ``retriever_version``; its retriever and
    the text of its documents (None for a version registered without it), which the lock guards
    while a delta is replayed into them, and the request limits it was logged with (``limits``).
    ``version`` names it in every answer: ``3``, or ``3+v0004`` for v3 extended up to the
    committed retriever version v0004."""

    retriever: Retriever
    documents: DocumentStore | None
    registered: str | None  # None: not known (a model loaded outside the registry)
    lineage: str | None
    registered_retriever: str  # the retriever version of ``registered``
    limits: ServeParams
    retriever_version: str = ""  # what is served: ``registered_retriever``, or a commit after it
    lock: SharedLock = field(default_factory=SharedLock)

    def __post_init__(self):
        self.retriever_version = self.retriever_version or self.registered_retriever

    @property
    def version(self) -> str | None:
        if self.retriever_version == self.registered_retriever:
            return self.registered
        return f"{self.registered}+{self.retriever_version}"

    @classmethod
    def of(cls, loaded: tuple[Retriever, DocumentStore | None], version: str | None,
           tags: dict[str, str], limits: ServeParams) -> ServedVersion:
        """A registered version, placed by its tags (a full training starts its own lineage at base),
        searched once before it answers: a retriever's first search pays its lazy set-up (the
        tokenizer's first call, torch's first kernels: 1.9 s at a server's start on 2 cores), which
        the first client, or the first after a swap, would otherwise wait for."""
        retriever, _ = loaded
        retriever.search([WARM_UP_QUERY], 1)
        return cls(*loaded, version, tags.get("lineage_root", version), tags.get("retriever_version", "base"), limits)

    @classmethod
    def loaded(cls, load, model: str | dict[str, str], version: str | None, tags: dict[str, str]) -> ServedVersion:
        """Version ``version`` (``model``: its URI, or its artifacts on this machine) loaded by
        ``load(artifacts, scratch)``: what it downloads (from a remote store: the model, its
        encoder, the retrievers its delta applies to) goes into a folder of its own, removed once
        the version is no longer served and the last request answered from it ended. (Each swap
        used to download into folders nothing removed, until the disk was full.)"""
        scratch = Path(tempfile.mkdtemp(prefix="fresh-serve-"))
        try:
            artifacts = download(model, scratch) if isinstance(model, str) else model
            served = cls.of(load(artifacts, scratch), version, tags, limits_of(artifacts))
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        weakref.finalize(served, shutil.rmtree, scratch, ignore_errors=True)
        return served


def serve_limits(text: str | None) -> ServeParams:
    """The request limits in a version's ``serve.json``; the defaults for a version logged
    without one (before versions carried their limits)."""
    # imported here, not above: fresh-registry serve reads this module's names without the model code
    from model_code.config import ServeParams

    return ServeParams() if text is None else ServeParams.model_validate_json(text)


def limits_of(artifacts: dict[str, str]) -> ServeParams:
    """The request limits of a version whose artifacts (local paths by name) are on this machine."""
    return serve_limits(Path(artifacts["serve"]).read_text() if "serve" in artifacts else None)


def registered_limits(name: str, version: str) -> ServeParams:
    """The request limits of registered version ``version``, read alone: its MLmodel and its
    ``serve.json``, not the whole model (from a remote store, a download of its code and retriever)."""
    root = ModelsArtifactRepository.get_underlying_uri(f"models:/{name}/{version}").rstrip("/")
    model = yaml.safe_load(mlflow.artifacts.load_text(f"{root}/MLmodel"))  # Model.load refuses file:// URIs
    spec = model["flavors"]["python_function"].get("artifacts", {})
    return serve_limits(mlflow.artifacts.load_text(f"{root}/{spec['serve']['path']}") if "serve" in spec else None)


def on_this_machine(artifact_uri: str, scratch: Path | None = None) -> Path:
    """An artifact as a path on this machine: a local store's own files (no copy), or, from a
    remote store (an MLflow server, object storage), a download into a new folder under
    ``scratch`` (None: a folder MLflow makes, which nothing removes)."""
    if artifact_uri.startswith("models:/"):  # the registry's name for it: where it is stored
        artifact_uri = ModelsArtifactRepository.get_underlying_uri(artifact_uri)
    if scratch is None or urlparse(artifact_uri).scheme in ("", "file"):
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri))
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=tempfile.mkdtemp(dir=scratch)))


def download(model_uri: str, scratch: Path | None = None) -> dict[str, str]:
    """A model's artifacts on this machine (local paths by name; ``on_this_machine``)."""
    local = on_this_machine(model_uri, scratch)
    spec = mlflow.models.Model.load(str(local)).flavors["python_function"].get("artifacts", {})
    return {key: str(local / value["path"]) for key, value in spec.items()}


def logged_here(commit) -> bool:
    """Whether a commit's run is in this process's tracking store: the commit is this deployment's.
    Only a store that says the run does not exist answers no; any other failure (a server
    unreachable for a moment) fails the read, which the next poll repeats, instead of dropping a
    commit that is served."""
    try:
        MlflowClient().get_run(commit.run_id)
    except MlflowException as exc:
        if exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            return False
        raise
    return True


def version_of(name: str, run_id: str | None) -> tuple[str, dict[str, str]] | None:
    """The registered version (and its tags) logged by run ``run_id``, if there is one."""
    found = MlflowClient().search_model_versions(f"name = '{name}' and run_id = '{run_id}'") if run_id else []
    return (str(found[0].version), dict(found[0].tags)) if found else None


class Follower:
    """Keeps ``served`` (the state a pyfunc answers from) on the version ``alias`` points at,
    extended by the updates committed after it."""

    def __init__(self, name: str, alias: str, served: ServedVersion, load, refresh_seconds: float):
        self.name, self.alias, self.refresh_seconds = name, alias, refresh_seconds
        self.served, self._load = served, load  # load(artifacts, scratch) -> (Retriever, DocumentStore | None)
        self._commits: CommitLog | None = None  # the served lineage's commit log (index.backend: milvus)
        self._commits_of: str | None = None  # the lineage it is of
        self._thread = threading.Thread(target=self._run, name=f"follow {name}@{alias}", daemon=True)

    @classmethod
    def from_environment(cls, served: ServedVersion, load, refresh_seconds: float) -> Follower | None:
        name, alias = os.environ.get(MODEL_ENV), os.environ.get(FOLLOW_ENV)
        if not (name and alias):
            return None
        return cls(name, alias, served, load, float(os.environ.get(REFRESH_ENV, refresh_seconds)))

    def start(self) -> Follower:
        if not log.handlers:  # the server's output says which version it serves from when
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
        log.info("serving v%s, following %s@%s every %g s", self.served.version, self.name, self.alias,
                 self.refresh_seconds)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:  # a daemon thread: it ends with the server process
            time.sleep(self.refresh_seconds)
            try:
                self.follow_once()
            except Exception:
                log.exception("following %s@%s failed; still serving v%s", self.name, self.alias, self.served.version)

    def follow_once(self) -> bool:
        """Move to the alias's version if it moved, then to the updates committed after it; return
        whether what is served changed."""
        target = MlflowClient().get_model_version_by_alias(self.name, self.alias)
        version, tags = str(target.version), dict(target.tags)
        # the served lineage's revocations, read before the alias is compared with what is served;
        # not for a target of another lineage, whose swap needs nothing of it (its server may be retired)
        if tags.get("lineage_root", version) == self.served.lineage and (commits := self._commit_log()) is not None:
            commits.read()
        moved = version != self.served.registered and self._follow_alias(version, tags)
        return self._follow_commits() or moved

    def _follow_alias(self, version: str, tags: dict[str, str]) -> bool:
        current, retriever_version = self.served, tags.get("retriever_version", "base")
        if tags.get("lineage_root", version) == current.lineage and self._extends(current, retriever_version):
            limits = registered_limits(self.name, version)
            with current.lock.writing():  # the commits it serves were registered: the same rows, renamed
                current.registered, current.registered_retriever, current.limits = version, retriever_version, limits
            log.info("%s@%s: v%s registers what is served, now v%s", self.name, self.alias, version, current.version)
            return True
        with tempfile.TemporaryDirectory(prefix="fresh-follow-") as scratch:  # deltas are read into memory
            steps = self._deltas_from(current, version, tags, Path(scratch))
            if steps is not None:
                deltas, limits = steps
                with current.lock.writing():
                    for delta, delta_version in deltas:
                        self._replay(current, delta, delta_version)
                    current.registered, current.registered_retriever, current.limits = version, retriever_version, limits
                log.info("%s@%s: replayed %d update(s) in place, now v%s", self.name, self.alias, len(deltas), version)
                return True
        self._swap(version, tags)
        return True

    def _follow_commits(self) -> bool:
        """Extend what is served by each commit after it (leaving commits a rollback revoked: the
        registered version again)."""
        commits = self._commit_log()  # read this poll (a new lineage's when it is read here)
        if commits is None:
            return False
        current, changed = self.served, False
        gone = self._chain_break(current, current.registered_retriever)
        if gone == "revoked" or (gone == "absent" and self._alias_names(current.registered)):
            self._swap(current.registered,
                       {"lineage_root": current.lineage, "retriever_version": current.registered_retriever})
            current, changed = self.served, True
        while commit := commits.next_after(current.retriever_version, self.alias):
            with tempfile.TemporaryDirectory(prefix="fresh-follow-") as scratch:
                delta = Path(mlflow.artifacts.download_artifacts(artifact_uri=commit.delta_uri, dst_path=scratch))
                if not self._replayable(current, delta, commit.delta_of):
                    break  # served without its documents' text: the registered version is loaded whole
                with current.lock.writing():
                    self._replay(current, delta, commit.version)
            log.info("%s@%s: replayed committed update %s in place, now v%s", self.name, self.alias, commit.version,
                     current.version)
            changed = True
        return changed

    def _commit_log(self) -> CommitLog | None:
        """The served lineage's commit log (kept while the lineage is, read when first made), None
        for an index in files."""
        from model_code.stores.milvus_commits import CommitLog

        current = self.served
        if self._commits_of != current.lineage:
            tags = dict(MlflowClient().get_model_version(self.name, current.lineage).tags) if current.lineage else {}
            self._commits, self._commits_of = CommitLog.of_tags(tags, logged_here), current.lineage
            if self._commits is not None:
                self._commits.read()
        return self._commits

    def _extends(self, current: ServedVersion, retriever_version: str) -> bool:
        """Whether what is served is ``retriever_version`` extended by unrevoked commits only."""
        return self._chain_break(current, retriever_version) is None

    def _chain_break(self, current: ServedVersion, until: str) -> str | None:
        """What stops what is served from being ``until`` extended by unrevoked commits: "revoked"
        (a rollback), "absent" (a commit on the way is not in the log, or there is no log), or
        None. A served commit absent beyond the registered version was trimmed: ``gc`` trims a
        commit only once its alias names a version holding it, so the absence is a revocation
        only when the alias (read again, after the log) still names the registered version (a
        rollback after the trim revokes nothing the log no longer has)."""
        step = current.retriever_version
        commits = self._commit_log() if step != until else None
        while step != until:
            if commits is None or step not in commits.commits:
                return "absent"
            if commits.is_revoked(step):
                return "revoked"
            step = commits.commits[step].delta_of
        return None

    def _alias_names(self, version: str | None) -> bool:
        return str(MlflowClient().get_model_version_by_alias(self.name, self.alias).version) == version

    def _swap(self, version: str, tags: dict[str, str]) -> None:
        """Load a registered version beside the served one and swap it in with one assignment."""
        before = self.served.version
        self.served = ServedVersion.loaded(self._load, f"models:/{self.name}/{version}", version, tags)
        log.info("%s@%s: v%s loaded beside v%s and swapped in", self.name, self.alias, self.served.version, before)

    @staticmethod
    def _replay(current: ServedVersion, delta: Path, delta_version: str) -> None:
        """Apply a downloaded delta in place (the caller holds the write lock)."""
        # imported here, not above: fresh-registry serve reads this module's names without the model code
        from model_code.retrievers import apply_deltas

        apply_deltas(current.retriever, [delta])
        if current.documents is not None:
            current.documents.apply_delta(delta)
        current.retriever_version = delta_version

    @staticmethod
    def _replayable(current: ServedVersion, delta: Path, delta_of: str) -> bool:
        """Whether ``delta`` is a delta of ``delta_of`` with the documents' text when the served version has it."""
        from model_code.retrievers import read_manifest
        from model_code.versions.documents import STORE_FILE

        manifest = read_manifest(delta)
        if not manifest.get("delta") or manifest.get("delta_of") != delta_of:
            return False
        return current.documents is None or (delta / STORE_FILE).is_file()  # registered without text: reload

    def _deltas_from(self, current: ServedVersion, version: str, tags: dict[str, str],
                     scratch: Path) -> tuple[list[tuple[Path, str]], ServeParams] | None:
        """(downloaded delta, retriever version) of each version after the served one up to
        ``version``, oldest first, when each is a delta of the one before in the served lineage,
        with ``version``'s request limits; None when ``version`` is not reached that way (another
        lineage, an earlier version, a whole copy on the way)."""
        if tags.get("lineage_root", version) != current.lineage:
            return None
        chain = []
        while tags.get("retriever_version", "base") != current.retriever_version:
            if tags.get("update") != "incremental":
                return None
            chain.append((version, tags["retriever_version"]))
            version = tags["parent_version"]
            tags = dict(MlflowClient().get_model_version(self.name, version).tags)
        steps, delta_of, limits = [], current.retriever_version, current.limits
        for step, retriever_version in reversed(chain):
            artifacts = download(f"models:/{self.name}/{step}", scratch)
            delta = Path(artifacts["retriever"])
            if not self._replayable(current, delta, delta_of):
                return None
            steps.append((delta, retriever_version))
            delta_of, limits = retriever_version, limits_of(artifacts)
        return steps, limits
