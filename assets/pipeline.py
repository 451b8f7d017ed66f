"""The pipeline's assets, one per stage of ``model_code.stages.pipeline.STAGES``: each unpacks its
config and resources, calls the stage's ``run(params, layout)`` and returns its summary as
metadata. The same list drives the CLI and ``dvc.yaml``, so nothing here is written per stage.

Each asset's code version is the hash of the params sections the stage reads (from the
workspace's params.yaml when definitions load) and of the project files it imports, so the UI
marks an asset stale after a change to either.
"""


import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator

import dagster as dg

from assets._common import DEPLOYMENT_POOL, artifact_metadata
from model_code.config import Params, load_params
from model_code.stages.encode_corpus import parse_shard
from model_code.stages.pipeline import STAGES, Stage, code_hash, upstream
from orchestration.resources import (
    MlflowResource,
    ParamsResource,
    StageConfig,
    WorkspaceResource,
    project_root,
)

log = logging.getLogger(__name__)


def params_version(params: Params | None, stage: Stage) -> str:
    if params is None:
        return "no-params"
    sections = {}
    for name in stage.params_sections():  # "section" or "section.key"
        value = params
        for part in name.split("."):
            value = getattr(value, part, None)  # None: a retriever kind's settings left out of params.yaml
        sections[name] = value.model_dump() if hasattr(value, "model_dump") else value
    return hashlib.sha256(json.dumps(sections, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _workspace_params() -> Params | None:
    path = os.path.join(project_root(), "params.yaml")
    try:
        return load_params(path)
    except (FileNotFoundError, ValueError) as exc:  # definitions still load; versions then follow the code alone
        log.warning("%s not loaded (%s): code versions follow the code alone and corpus_shards has one partition",
                    path, exc)
        return None


@contextlib.contextmanager
def mlflow_uri(uri: str) -> Iterator[None]:
    """The MLflow resource's store for stages that log (registration), as MLflow's own setting."""
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        yield
    finally:
        if uri:
            os.environ.pop("MLFLOW_TRACKING_URI") if previous is None else os.environ.update(MLFLOW_TRACKING_URI=previous)


SHARDS_FROM_DEFINITIONS = ("the partitions come from data.shards as the definitions loaded it: reload the "
                           "definitions (and check the warning they log when params.yaml cannot be loaded)")
# what a step that wants a GPU asks a Kubernetes executor for (dagster-k8s reads this tag; other executors ignore it)
GPU_TAGS = {"dagster-k8s/config": {"container_config": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}}


def shard_partitions(params: Params | None) -> dg.StaticPartitionsDefinition:
    """One partition per shard of ``data.shards`` (params.yaml's when the definitions load)."""
    return dg.StaticPartitionsDefinition([str(i) for i in range(params.data.shards if params else 1)])


def stage_asset(stage: Stage, params: Params | None) -> dg.AssetsDefinition:
    """The stage as an asset; a sharded stage as an asset with one partition per shard, each run
    (and retried) on its own."""
    @dg.asset(name=stage.asset, group_name=stage.group, description=stage.description,
              deps=[other.asset for other in upstream(stage)],
              code_version=f"{params_version(params, stage)}-{code_hash(stage)}",
              pool=DEPLOYMENT_POOL if stage.moves_champion else None,
              partitions_def=shard_partitions(params) if stage.sharded else None,
              op_tags=GPU_TAGS if stage.wants_gpu else None)
    def _materialize(context: dg.AssetExecutionContext, config: StageConfig, params: ParamsResource,
                     workspace: WorkspaceResource, mlflow_store: MlflowResource) -> dg.MaterializeResult:
        settings = params.load(workspace, config.parsed())
        layout = workspace.layout()
        shards = len(context.assets_def.partitions_def.get_partition_keys()) if stage.sharded else 0
        shard = {"shard": parse_shard(f"{context.partition_key}/{shards}", settings, SHARDS_FROM_DEFINITIONS)} \
            if stage.sharded else {}
        with mlflow_uri(mlflow_store.tracking_uri):
            summary = stage.runner()(settings, layout, **shard)
        return dg.MaterializeResult(metadata=artifact_metadata(getattr(layout, stage.writes[0]), summary))

    return _materialize


_PARAMS = _workspace_params()
# the pipeline's assets, and those of the sharded stages apart: a job's assets share one partitioning, so
# the sharded encoding is a job of its own, and the index stage encodes whatever no shard run has
PIPELINE_ASSETS = [stage_asset(stage, _PARAMS) for stage in STAGES if not stage.sharded]
SHARDED_ASSETS = [stage_asset(stage, _PARAMS) for stage in STAGES if stage.sharded]
