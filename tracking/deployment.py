"""The MLflow side of deployments: the model registry the freshness loop applies batches through
(``MlflowRegistry``, the ``ModelRegistry`` of ``model_code.freshness.deployment``), and the runs
that record drift reports, failed runs and versions written by the update commands.

The registry is the source of truth for what is deployed: ``models:/<name>@champion``. Every
incremental update is registered as a new model version (same encoder, new retriever version)
tagged ``update=incremental``, ``lineage_root``, ``retriever_version`` and ``parent_version``, and
the ``champion`` alias moves to it. On Milvus (``index.backend: milvus``) the update is committed
to its lineage's commit log first (``model_code/stores/milvus_commits.py``) and served from there; its
registered version is then the record of the commit, and a commit left unregistered by a stop is
registered by the next writer (``register_commits``).

Why a registered version per update rather than a reload endpoint: the served model stays an
immutable, reproducible artifact; ``mlflow models serve -m models:/<name>@champion`` serves the
new documents after a restart (or a blue/green swap), any version can be served or rolled back
(``fresh-registry rollback`` steps back one update at a time), and MLflow shows every update
with its timings and drift statistics. An update keeps its lineage's encoder, so its version
stores the new retriever and a reference to the encoder artifact its full training logged
(``encoder_ref``), not another copy of the weights.

An incremental version logs its update's timings and the drift report's statistics (the canary
MRR@10 with the batch added among them), not evaluation metrics it did not measure: a full
retrain is compared with the champion re-evaluated on the retrain's own data
(``registry.champion_on_this_data``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, ErrorCode

from model_code.config import Params
from model_code.freshness.deployment import ChampionRef, NoChampionError, installed
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.retrievers import kind_class, read_manifest
from model_code.stores.milvus_commits import Commit, CommitLog, written_by
from model_code.versions.chain import RetrieverVersions
from tracking.collections import collection_tags, follow_alias
from tracking.following import logged_here, version_of
from tracking.pyfunc import log_retriever, retriever_bases
from tracking.store import configure, metric_name

log = logging.getLogger(__name__)
DELTA_ARTIFACT = "retriever_delta"  # an update's run artifact: the retriever version a commit's servers replay
SEARCH_PAGE = 1000  # registered versions per search request
# MLflow's answers for no such model and no such alias
NOT_FOUND = frozenset(ErrorCode.Name(code) for code in (RESOURCE_DOES_NOT_EXIST, INVALID_PARAMETER_VALUE))


def numbers(values: dict, prefix: str) -> dict[str, float]:
    """A manifest's or report's numbers as MLflow metrics: numeric values as they are, lists
    (documents added, additions that could not be separated, ...) by their length."""
    out = {}
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[metric_name(f"{prefix}{key}")] = float(value)
        elif isinstance(value, list):
            out[metric_name(f"{prefix}{key}_count")] = float(len(value))
    return out


class MlflowRegistry:
    """``ModelRegistry`` over the MLflow model registry named by ``registry.model_name``."""

    def __init__(self, params: Params, layout: Layout, tracking_uri: str | None = None):
        configure(layout.root, params.registry.experiment, tracking_uri)
        self.name, self.client, self.layout = params.registry.model_name, MlflowClient(), layout
        self.serve = params.serve  # the endpoint limits every version it registers is logged with

    def champion(self) -> ChampionRef:
        version = self.alias_version("champion")
        if version is None:
            raise NoChampionError(f"registered model {self.name!r} has no champion yet: run the full pipeline first")
        return ChampionRef(str(version.version), dict(version.tags))

    def all_versions(self, page_size: int = SEARCH_PAGE, where: str = "") -> list[ModelVersion]:
        """Every registered version of the model (``where``: those this filter also matches), page
        after page: one search returns at most a page (MLflow's default, 10,000), and ``gc`` took
        the versions past it for garbage."""
        versions, token = [], None
        query = f"name = '{self.name}'" + (f" and {where}" if where else "")
        while True:
            page = self.client.search_model_versions(query, max_results=page_size, page_token=token)
            versions += list(page)
            token = page.token
            if not token:
                return versions

    def alias_version(self, alias: str) -> ModelVersion | None:
        """The version ``alias`` names; None only where the store says the model or the alias does
        not exist. Any other failure (a locked SQLite store, a tracking server down for a moment)
        is raised: read as "no champion", it made a retrain champion whatever its score, and let
        an exclusion skip its check that the champion does not serve the batch."""
        try:
            return self.client.get_model_version_by_alias(self.name, alias)
        except MlflowException as exc:
            if exc.error_code in NOT_FOUND:  # no such model, no such alias (MLflow's codes for either)
                return None
            raise

    def retriever_versions(self, lineage_root: str) -> set[str]:
        registered = self.all_versions(where=f"tags.lineage_root = '{lineage_root}'")
        names = {v.tags["retriever_version"] for v in registered if "retriever_version" in v.tags}
        commits = self.commit_log(ChampionRef(lineage_root))  # committed, registered or not (a stop between)
        return names | (set(commits.read().commits) if commits is not None else set())

    def version(self, version: str) -> ChampionRef:
        try:
            found = self.client.get_model_version(self.name, str(version))
        except MlflowException as exc:
            if exc.error_code in NOT_FOUND:
                raise LookupError(f"registered model {self.name!r} has no version {version}") from None
            raise
        return ChampionRef(str(found.version), dict(found.tags))

    def promote(self, version: str, reason: str) -> None:
        """Make ``version`` the champion, first revoking the commits of its lineage it does not hold
        (a rollback within a lineage: servers would otherwise extend it with them again)."""
        target = self.version(version)
        commits = self.commit_log(target)
        if commits is not None:
            held = commits.read().ancestors(target.retriever_version)
            for commit in commits.commits.values():
                if commit.version not in held and not commits.is_revoked(commit.version):
                    commits.revoke(commit, f"champion moved to v{version}: {reason}")
        self.client.set_registered_model_alias(self.name, "champion", str(version))
        self.client.set_model_version_tag(self.name, str(version), "promotion", reason)
        follow_alias(self.name, "champion", target.tags)

    def commit_log(self, version: ChampionRef) -> CommitLog | None:
        """The commit log of ``version``'s lineage: beside the collection its full training's version
        names (as the servers following it find it), None for an index in files."""
        return CommitLog.of_tags(self.version(version.lineage_root).tags, logged_here)

    def register_commits(self, champion: ChampionRef) -> ChampionRef:
        """Register the updates committed to ``champion``'s lineage after it and not registered
        (an update stopped between its commit and its registration; servers already serve them),
        oldest first; the champion then."""
        commits = self.commit_log(champion)
        while commits is not None and (commit := commits.read().next_after(champion.retriever_version, "champion")):
            found = version_of(self.name, commit.run_id)  # registered, but the alias not moved
            version = found[0] if found else self._register(self._model_of(commit, champion), commit.tags)
            self._make_champion(version, commit.tags)
            log.warning("update %s was committed to %s but not registered (a stop in between): registered as v%s",
                        commit.version, champion.tags["index_collection"], version)
            champion = self.version(version)
        return champion

    def _model_of(self, commit: Commit, parent: ChampionRef) -> str:
        """The URI of the model a commit's run logged, logging it first when the run stopped before
        (from this machine's copy of the committed retriever version, or the one its run logged)."""
        logged = [model for model in mlflow.search_logged_models(
            experiment_ids=[self.client.get_run(commit.run_id).info.experiment_id],
            filter_string=f"source_run_id = '{commit.run_id}'", output_format="list") if model.status == "READY"]
        if logged:  # its run may have stopped between logging it and setting its signature: set again
            mlflow.models.set_signature(logged[0].model_uri, self._signature_of(parent))
            return logged[0].model_uri
        deployment = installed(self, self.layout, parent)
        version_dir = RetrieverVersions(deployment).version_dir(commit.version)
        if not version_dir.is_dir():  # committed on another machine
            version_dir.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=version_dir.parent) as tmp:
                local = mlflow.artifacts.download_artifacts(artifact_uri=commit.delta_uri, dst_path=tmp)
                with atomic_path(version_dir) as out:
                    os.replace(local, out)
        with mlflow.start_run(run_id=commit.run_id):
            return self._log_model(deployment, parent, version_dir).model_uri

    def _log_model(self, deployment: Layout, parent: ChampionRef, version_dir: Path):
        """Log the retriever version in ``version_dir`` (an update of ``parent``) as the active run's model."""
        stored = read_manifest(version_dir)
        encoder_uri = self.artifact_uri(parent.lineage_root, "encoder") if kind_class(stored["kind"]).uses_encoder else None
        return log_retriever(deployment.encoder, version_dir, self.serve, encoder_uri,
                             self._delta_bases(version_dir, stored, parent), self._signature_of(parent))

    def _signature_of(self, parent: ChampionRef):
        """The signature an update's model has: its parent's, with the request params (k, return) the
        server reads (MLflow's own, from ``predict``'s type hints, has none: every request would get
        the defaults)."""
        return mlflow.models.get_model_info(f"models:/{self.name}/{parent.version}").signature

    def download(self, version: str, destination: Path) -> dict[str, Path]:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{self.name}/{version}",
                                                         dst_path=str(destination)))
        # the pyfunc stores each artifact under a path of its own choosing; its MLmodel maps names to paths
        artifacts = mlflow.models.Model.load(str(local)).flavors["python_function"].get("artifacts", {})
        return {name: local / spec["path"] for name, spec in artifacts.items()}

    def artifact_uri(self, version: str, name: str) -> str:
        """Where artifact ``name`` of a registered version is stored (its pyfunc's MLmodel maps
        artifact names to paths inside the model)."""
        model_uri = self.client.get_model_version_download_uri(self.name, str(version))
        spec = mlflow.models.Model.load(f"models:/{self.name}/{version}").flavors["python_function"]["artifacts"]
        if name not in spec:
            raise LookupError(f"{self.name} v{version} has no {name} artifact (it has {sorted(spec)})")
        return f"{model_uri.rstrip('/')}/{spec[name]['path']}"

    def _delta_bases(self, version_dir: Path, manifest: dict, parent: ChampionRef) -> list[str]:
        """For a retriever version (``manifest``) stored as a delta of ``parent``'s: the artifact
        URIs loading it replays first (the parent's own bases, then the parent's retriever); none
        for a whole copy."""
        if not manifest.get("delta"):
            return []
        if manifest["delta_of"] != parent.retriever_version:
            raise ValueError(f"{version_dir} is a delta of {manifest['delta_of']}, not of the champion's "
                             f"retriever version {parent.retriever_version}")
        return self.retriever_uris(parent.version)

    def retriever_uris(self, version: str) -> list[str]:
        """The artifact URIs that load a registered version's retriever, in the order to apply
        them: the retrievers its delta applies to (none for a whole one), then its own."""
        try:
            chain = {"retriever_chain": mlflow.artifacts.download_artifacts(
                artifact_uri=self.artifact_uri(version, "retriever_chain"))}
        except LookupError:  # stored whole
            chain = {}
        return [*retriever_bases(chain), self.artifact_uri(version, "retriever")]

    def register_update(self, deployment: Layout, parent: ChampionRef, manifest: dict, drift: dict) -> dict:
        """Log the update's run, commit it (on Milvus: servers following the champion serve it from
        here on), log its model, register it and make it the champion."""
        name = self.name
        version_dir = RetrieverVersions(deployment).version_dir(manifest["version"])
        stored = read_manifest(version_dir)
        tags = {"update": "incremental", "parent_version": parent.version, "lineage_root": parent.lineage_root,
                "retriever": stored["kind"], "retriever_version": manifest["version"],
                "batch_sha256": manifest["batch_sha256"],
                "passage_text": parent.passage_text}  # the lineage's vectors are made from its form until a retrain
        commits = self.commit_log(parent) if stored.get("delta") else None  # a whole copy: served once registered
        with mlflow.start_run(run_name=f"incremental v{parent.version}+{manifest['version']}") as run:
            mlflow.set_tags(tags)
            mlflow.log_metrics({**numbers(manifest, "update."), **numbers(drift, "drift.")})
            mlflow.log_artifact(str(version_dir / "manifest.json"), artifact_path="update")
            tags.update(replaced_champion=parent.version,
                        promotion=f"incremental update of v{parent.version}: +{manifest['added']} documents",
                        **collection_tags(version_dir))
            if commits is not None:  # the delta (kilobytes) first, then the commit: the model's logging is seconds
                mlflow.log_artifacts(str(version_dir), artifact_path=DELTA_ARTIFACT)
                self._check_champion(parent)
                held = RetrieverVersions(deployment).chain(parent.retriever_version)
                commits.commit(Commit(version=manifest["version"], delta_of=parent.retriever_version,
                                      delta_uri=f"{run.info.artifact_uri}/{DELTA_ARTIFACT}", run_id=run.info.run_id,
                                      alias="champion", tags={k: str(v) for k, v in tags.items()},
                                      write_sets=written_by(version_dir, held)))
            model_info = self._log_model(deployment, parent, version_dir)
        self._check_champion(parent)
        version = self._register(model_info.model_uri, tags)
        self._make_champion(version, tags)
        log.info("incremental update %s registered as %s v%s (champion)", manifest["version"], name, version)
        return {"registered_version": int(version), "run_id": run.info.run_id, "model_uri": f"models:/{name}/{version}"}

    def _check_champion(self, parent: ChampionRef) -> None:
        if self.champion().version != parent.version:  # moved outside the deployment lock: do not overwrite it
            raise RuntimeError(f"champion moved away from v{parent.version} during the update; not registered")

    def _register(self, model_uri: str, tags: dict) -> str:
        return str(mlflow.register_model(model_uri, self.name, tags={k: str(v) for k, v in tags.items()}).version)

    def _make_champion(self, version: str, tags: dict) -> None:
        self.client.set_registered_model_alias(self.name, "champion", version)
        follow_alias(self.name, "champion", tags)


def log_drift_report(
    params: Params, layout: Layout, batch_id: str, champion_version: str, report: dict, tracking_uri: str | None = None
) -> str:
    """One MLflow run per drift report (tags: batch, decision, champion), its statistics as metrics."""
    configure(layout.root, params.registry.experiment, tracking_uri)
    with mlflow.start_run(run_name=f"drift {batch_id}") as run:
        mlflow.set_tags({"kind": "drift_report", "batch_id": batch_id, "decision": report["decision"],
                         "champion_version": champion_version, "reasons": "; ".join(report["reasons"])[:5000]})
        mlflow.log_metrics({f"drift.{metric_name(k)}": float(v) for k, v in report["statistics"].items()})
        mlflow.log_metric("drift.seconds", report["seconds"])
    return run.info.run_id


def record_failure(params: Params, layout: Layout, job: str, run_id: str, error: str, tracking_uri: str | None = None) -> str:
    """A failed Dagster run as a tagged MLflow run, so failures show next to the runs they interrupted."""
    configure(layout.root, params.registry.experiment, tracking_uri)
    with mlflow.start_run(run_name=f"failed {job}") as run:
        mlflow.set_tags({"kind": "failure", "dagster_job": job, "dagster_run_id": run_id, "error": error[:5000]})
    return run.info.run_id


def log_updates(params: Params, layout: Layout, tracking_uri: str | None = None) -> list[str]:
    """Log every retriever version written by ``fresh-retriever add/edit/remove-documents`` that is
    not in MLflow yet (tag ``update_version``), with its timings, counts, manifest and rejects.
    Idempotent; returns the versions logged now."""
    experiment = configure(layout.root, params.registry.experiment, tracking_uri)
    versions = RetrieverVersions(layout)
    runs = MlflowClient().search_runs([experiment], "tags.kind = 'index_update'", max_results=50_000)
    logged = {run.data.tags.get("update_version") for run in runs}
    done = []
    for manifest_file in sorted(versions.root.glob("v*/manifest.json")):
        manifest = json.loads(manifest_file.read_text())
        key = f"{manifest['kind']}/{manifest['version']}"
        if key in logged:
            continue
        with mlflow.start_run(run_name=f"{manifest['kind']} {manifest['operation']} {manifest['version']}"):
            mlflow.set_tags({"kind": "index_update", "update_version": key, "operation": manifest["operation"],
                             "parent": manifest["parent"], "batch": manifest.get("batch", "")})
            mlflow.log_metrics(numbers(manifest, "update."))
            for name in ("manifest.json", "rejects.jsonl"):
                if (manifest_file.parent / name).exists():
                    mlflow.log_artifact(str(manifest_file.parent / name), artifact_path="update")
        done.append(key)
    return done
