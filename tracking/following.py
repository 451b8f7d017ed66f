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
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
from mlflow import MlflowClient

if TYPE_CHECKING:
    from model_code.retrievers import Retriever
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
    """One registered version as served: its retriever and the text of its documents (None for a
    version registered without it), which the lock guards while a delta is replayed into them."""

    retriever: Retriever
    documents: DocumentStore | None
    version: str | None  # None: not known (a model loaded outside the registry)
    lineage: str | None
    retriever_version: str | None
    lock: SharedLock = field(default_factory=SharedLock)

    @classmethod
    def of(cls, loaded: tuple[Retriever, DocumentStore | None], version: str | None,
           tags: dict[str, str]) -> ServedVersion:
        """A registered version, placed by its tags (a full training starts its own lineage at base),
        searched once before it answers: a retriever's first search pays its lazy set-up (the
        tokenizer's first call, torch's first kernels: 1.9 s at a server's start on 2 cores), which
        the first client, or the first after a swap, would otherwise wait for."""
        retriever, _ = loaded
        retriever.search([WARM_UP_QUERY], 1)
        return cls(*loaded, version, tags.get("lineage_root", version), tags.get("retriever_version", "base"))


def download(name: str, version: str, destination: Path | None = None) -> dict[str, str]:
    """A version's artifacts on this machine (local paths by name), under ``destination``
    (default: a directory MLflow chooses, kept: a swapped-in version may read its files after
    loading, as the encoder does on first use)."""
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}",
                                                     dst_path=str(destination) if destination else None))
    spec = mlflow.models.Model.load(str(local)).flavors["python_function"].get("artifacts", {})
    return {key: str(local / value["path"]) for key, value in spec.items()}


def version_of(name: str, run_id: str | None) -> tuple[str, dict[str, str]] | None:
    """The registered version (and its tags) logged by run ``run_id``, if there is one."""
    found = MlflowClient().search_model_versions(f"name = '{name}' and run_id = '{run_id}'") if run_id else []
    return (str(found[0].version), dict(found[0].tags)) if found else None


class Follower:
    """Keeps ``served`` (the state a pyfunc answers from) on the version ``alias`` points at."""

    def __init__(self, name: str, alias: str, served: ServedVersion, load, refresh_seconds: float):
        self.name, self.alias, self.refresh_seconds = name, alias, refresh_seconds
        self.served, self._load = served, load  # load(artifacts) -> (Retriever, DocumentStore | None): a version
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
        """Move to the alias's version if it moved; return whether the served version changed."""
        # imported here, not above: fresh-registry serve reads this module's names without the model code
        from model_code.retrievers import apply_deltas

        target = MlflowClient().get_model_version_by_alias(self.name, self.alias)
        current = self.served
        if str(target.version) == current.version:
            return False
        with tempfile.TemporaryDirectory(prefix="fresh-follow-") as scratch:  # deltas are read into memory
            steps = self._deltas_from(current, str(target.version), dict(target.tags), Path(scratch))
            if steps is not None:
                with current.lock.writing():
                    for version, delta, retriever_version in steps:
                        apply_deltas(current.retriever, [delta])
                        if current.documents is not None:
                            current.documents.apply_delta(delta)
                        current.version, current.retriever_version = version, retriever_version
                log.info("%s@%s: replayed %d update(s) in place, now v%s", self.name, self.alias, len(steps),
                         target.version)
                return True
        self.served = ServedVersion.of(self._load(download(self.name, str(target.version))), str(target.version),
                                       dict(target.tags))
        log.info("%s@%s: v%s loaded beside v%s and swapped in", self.name, self.alias, target.version, current.version)
        return True

    def _deltas_from(self, current: ServedVersion, version: str, tags: dict[str, str],
                     scratch: Path) -> list[tuple[str, Path, str]] | None:
        """(version, downloaded delta, retriever version) of each version after the served one up
        to ``version``, oldest first, when each is a delta of the one before in the served lineage;
        None when ``version`` is not reached that way (another lineage, an earlier version, a whole
        copy on the way)."""
        from model_code.retrievers import read_manifest
        from model_code.versions.documents import STORE_FILE

        if tags.get("lineage_root", version) != current.lineage:
            return None
        chain = []
        while version != current.version:
            if tags.get("update") != "incremental":
                return None
            chain.append(version)
            version = tags["parent_version"]
            tags = dict(MlflowClient().get_model_version(self.name, version).tags)
        steps, delta_of = [], current.retriever_version
        for step in reversed(chain):
            delta = Path(download(self.name, step, scratch / step)["retriever"])
            manifest = read_manifest(delta)
            if not manifest.get("delta") or manifest.get("delta_of") != delta_of:
                return None
            if current.documents is not None and not (delta / STORE_FILE).is_file():  # registered without text
                return None
            delta_of = manifest["version"]
            steps.append((step, delta, delta_of))
        return steps

