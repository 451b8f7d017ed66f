"""The project's Definitions on Kubernetes: the same assets, checks, jobs, sensors and resources as
``orchestration.definitions``, with each step of a run in a Kubernetes Job of its own (dagster-k8s's
``k8s_job_executor``, configured by ``executor.yaml`` beside this file). The train step asks for a
GPU (its ``dagster-k8s/config`` tag, from the stage list's ``wants_gpu``); each partition of the
sharded encoding is a run of its own, so a backfill of ``encode_corpus`` puts one shard in each
pod. The user code deployment of the Dagster Helm chart loads this module (``values.yaml``); the
instance (run launcher, storage) is ``dagster.yaml`` beside it."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml
from dagster._config import process_config
from dagster_k8s import k8s_job_executor

from orchestration.definitions import definitions

EXECUTOR_FILE = Path(__file__).with_name("executor.yaml")


def k8s_executor(path: Path = EXECUTOR_FILE) -> dg.ExecutorDefinition:
    """``k8s_job_executor`` configured by ``path``, checked against its schema now: ``configured``
    alone checks nothing until a run starts in the cluster, and a misspelt key would surface there."""
    config = yaml.safe_load(Path(path).read_text())
    checked = process_config(k8s_job_executor.config_schema.config_type, config)
    if not checked.success:
        raise ValueError(f"{path}: " + "; ".join(error.message for error in checked.errors))
    return k8s_job_executor.configured(config, name="k8s")


EXECUTOR_CONFIG = yaml.safe_load(EXECUTOR_FILE.read_text())
defs = definitions(executor=k8s_executor())
