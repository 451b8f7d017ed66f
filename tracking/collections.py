"""The Milvus side of the registry (``index.backend: milvus``): registered versions name the
collection they are a view of, the deployment's Milvus alias follows its MLflow alias, and
``fresh-registry gc`` drops what no registered version refers to and trims the commit rows
(``model_code/stores/milvus_commits.py``) no server needs any more.

Why here: what "may be served" is the registry's knowledge (any registered version can be made
champion again by a rollback), so only the registry side can tell which collections and
write-sets are garbage; the store (``model_code/stores/milvus_store.py``) does the deleting.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
from mlflow.entities.model_registry import ModelVersion

from model_code.config import Params
from model_code.io import exclusive_lock
from model_code.layout import Layout
from model_code.stores.milvus_commits import Commit, CommitLog
from model_code.stores.milvus_store import Connection, MilvusStoreError, point_alias, references_in, sweep
from model_code.versions.chain import RetrieverVersions

if TYPE_CHECKING:
    from tracking.deployment import MlflowRegistry

log = logging.getLogger(__name__)


def collection_tags(retriever_dir: Path) -> dict[str, str]:
    """The tags of a registered version whose retriever is a view of a Milvus collection: its URI and
    name (the write-sets it holds are in its artifacts); none for a retriever kept in files."""
    references = references_in(retriever_dir)
    if not references:
        return {}
    first = references[0]
    tags = {"index_uri": first["uri"], "index_collection": first["collection"]}
    if first.get("token"):
        tags["index_token_env"] = first["token"]
    return tags


def milvus_alias(model_name: str, alias: str) -> str:
    """The Milvus alias of MLflow alias ``alias`` of ``model_name`` (letters, digits, underscores)."""
    return re.sub(r"\W", "_", f"{model_name}_{alias}")


def follow_alias(model_name: str, alias: str, tags: dict[str, str]) -> None:
    """Point the deployment's Milvus alias at the collection of the version MLflow's ``alias`` now
    names (nothing for a version kept in files). A failure is logged, not raised: the registry's
    alias has moved and is what servers follow; the Milvus alias serves clients reading Milvus
    directly and is pointed again at the next promotion."""
    if "index_collection" in tags:
        try:
            point_alias(tags["index_uri"], tags["index_collection"], milvus_alias(model_name, alias),
                        tags.get("index_token_env"))
        except MilvusStoreError as exc:
            log.warning("the Milvus alias of %s@%s was not moved: %s", model_name, alias, exc)


def collect_garbage(params: Params, layout: Layout, grace_s: float, apply: bool,
                    tracking_uri: str | None = None) -> dict:
    """Collections and write-sets no registered version (in the MLflow store at ``tracking_uri``,
    default: the project's) and no current version of ``layout`` refers to, at every Milvus URI
    they use (and ``index.milvus.uri``), and settled commit rows: dropped with ``apply``, listed without."""
    from tracking.deployment import MlflowRegistry
    from tracking.following import logged_here

    registry = MlflowRegistry(params, layout, tracking_uri)
    referenced: dict[str, set[int]] = defaultdict(set)
    uris = {params.index.milvus.uri}
    # what the workspace serves without the registry (the index stage's retriever and the current version
    # of `fresh-retriever add-documents`); deployments' copies are the registry's (an update in flight there
    # is younger than the grace period)
    workspace = RetrieverVersions(layout)
    directories = [layout.retriever, *(workspace.chain(workspace.current_name) if layout.retriever.is_dir() else [])]
    registered = registry.all_versions()
    if apply and not registered:  # the wrong store (MLFLOW_TRACKING_URI unset, say) would make everything garbage
        raise LookupError(f"the MLflow store at {mlflow.get_tracking_uri()} has no versions of {registry.name!r}: "
                          "nothing collected (every collection would have been); point MLFLOW_TRACKING_URI at "
                          "the deployment's store")
    # a delta's bases too: a registered version deleted by hand is still applied to
    retrievers = {uri for version in registered for uri in registry.retriever_uris(version.version)}
    directories += [Path(mlflow.artifacts.download_artifacts(artifact_uri=uri)) for uri in sorted(retrievers)]
    lineages = set()
    for directory in directories:
        for reference in references_in(directory):
            referenced[reference["collection"]].update(reference["write_sets"])
            uris.add(reference["uri"])
            lineages.add((reference["uri"], reference["collection"], reference.get("token")))
    trimmed = {}
    with exclusive_lock(layout.deployments / ".lock"):  # no alias moves between reading it and trimming
        for uri, collection, token in sorted(lineages, key=str):  # committed updates are served before registered
            commits = CommitLog(Connection(uri=uri, collection=collection, dimension=0, token=token), logged_here)
            for name, write_sets in commits.read().served_write_sets().items():
                referenced[name].update(write_sets)
            settled = settled_commits(registry, commits, collection, registered, grace_s)
            if apply:
                commits.trim(settled, f"registered more than {grace_s:g} s ago and held by what their alias names")
            trimmed[collection] = len(settled)
    milvus = params.index.milvus
    report = {uri: sweep(uri, referenced, milvus.collection_prefix, grace_s, milvus.token, milvus.timeout_s,
                         dry_run=not apply) for uri in sorted(uris)}
    log.info("milvus gc (%s): %s; commit rows trimmed: %s", "applied" if apply else "dry run", report, trimmed)
    return {"applied": apply, "grace_s": grace_s, "referenced_collections": sorted(referenced), "by_uri": report,
            "commit_rows_trimmed": trimmed}


def settled_commits(registry: MlflowRegistry, commits: CommitLog, lineage: str, registered: list[ModelVersion],
                    grace_s: float) -> list[Commit]:
    """The deployment's commits in ``lineage``'s log that no server needs any more: each registered
    (one of ``registered``) more than ``grace_s`` ago and not revoked, and held by the version its
    alias names when that version is of this lineage (a server serves that version and the
    commits *after* it; it reads its rows from the registered versions, which ``gc`` keeps). When
    the alias names another lineage, a rollback to this one revokes every commit the version it
    moves to does not hold, so none is served after it. A revocation and what it revokes stay: a
    rollback is rare, and a server must see it to go back."""
    by_number, by_run = {str(v.version): v for v in registered}, {v.run_id: v for v in registered}
    held: dict[str, set[str] | None] = {}  # per alias, the retriever versions its version holds; None: another lineage
    for alias in {commit.alias for commit in commits.commits.values()}:
        # an alias never set or deleted: nothing follows it; a failing read stops gc (it trimmed what was served)
        if (named := registry.alias_version(alias)) is not None:
            held[alias] = held_by(str(named.version), by_number) if named.tags.get("index_collection") == lineage \
                else None
    settled = []
    for commit in commits.commits.values():
        version = by_run.get(commit.run_id)
        if (version is None or time.time() - version.creation_timestamp / 1000 <= grace_s
                or commits.is_revoked(commit.version)):
            continue
        if held.get(commit.alias) is None or commit.version in held[commit.alias]:
            settled.append(commit)
    return settled


def held_by(version: str, by_number: dict[str, ModelVersion]) -> set[str]:
    """The retriever versions registered version ``version`` holds: its own, and through its
    updates' ``parent_version`` tags its ancestors' (whole copies included, which the commit log
    has no row of)."""
    held = set()
    while version in by_number:
        tags = by_number[version].tags
        held.add(tags.get("retriever_version", "base"))
        if tags.get("update") != "incremental":
            break
        version = tags["parent_version"]
    return held
