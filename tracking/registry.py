"""Log a pipeline run to MLflow, register its retriever and move the aliases.

Promotion rule: the new version becomes ``champion`` when there is no champion yet, or when its
``registry.metric`` on ``registry.decision_split`` (dev: test is only reported) beats the
champion's, re-measured on the same data and split in the same run, by more than
``registry.min_improvement``; otherwise it becomes ``challenger``. The version is found by this run's id, never "the latest version".
"""

from __future__ import annotations

import json
import logging
import time

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Metric

from model_code.config import Params, flatten
from model_code.data.ingested import IngestedData, load_ingested
from model_code.freshness.deployment import NoChampionError, installed
from model_code.freshness.inbox import Inbox
from model_code.freshness.report import PASSAGE_TEXT
from model_code.io import exclusive_lock, write_json
from model_code.layout import Layout
from model_code.retrievers import Retriever, load_retriever, read_manifest
from model_code.stages.evaluate import score
from model_code.versions.chain import RetrieverVersions
from tracking.collections import collection_tags, follow_alias
from tracking.deployment import MlflowRegistry
from tracking.pyfunc import log_retriever
from tracking.store import configure, metric_name

log = logging.getLogger(__name__)

def decision_value(retriever: Retriever, params: Params, data: IngestedData) -> float:
    """``registry.metric`` of ``retriever`` on ``registry.decision_split``: what promotion compares."""
    split = params.registry.decision_split
    if split not in data.qrels:
        raise ValueError(f"registry.decision_split={split!r}: the ingested data has no {split} qrels "
                         f"(has {sorted(data.qrels)}); carve dev from train (data.dev_fraction) or choose another split")
    means, _, _ = score(retriever, data, params.eval.model_copy(update={"split": split}))
    return means[params.registry.metric]


def champion_on_this_data(params: Params, layout: Layout, data: IngestedData,
                          tracking_uri: str | None) -> tuple[str | None, float | None]:
    """(version, decision value) of the current champion re-measured on this workspace's ingested
    data (same corpus, queries and split as the challenger), or (None, None) when there is none.
    Metrics logged when the champion was registered were measured on another corpus (a retrain
    adds every accepted batch), and incremental versions have none of their own."""
    registry = MlflowRegistry(params, layout, tracking_uri)
    try:
        champion = registry.champion()
    except NoChampionError:
        return None, None
    deployment = installed(registry, layout, champion)
    retriever = RetrieverVersions(deployment).load_version(champion.retriever_version)
    return champion.version, decision_value(retriever, params, data)


def decide_alias(new_value: float, champion_value: float | None, min_improvement: float) -> tuple[str, str]:
    if champion_value is None:
        return "champion", "no champion yet"
    if new_value > champion_value + min_improvement:
        return "champion", f"{new_value:.4f} beats champion {champion_value:.4f} by more than {min_improvement}"
    return "challenger", f"{new_value:.4f} does not beat champion {champion_value:.4f} by more than {min_improvement}"


def _numeric(summary: dict, prefix: str) -> dict[str, float]:
    return {
        metric_name(f"{prefix}{k}"): float(v)
        for k, v in summary.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def log_training_curves(layout: Layout) -> None:
    """Per-step losses (per HCE level too), per-round dev metric / re-clustering events (HCE) and
    the dev scores of checkpoint selection (``train.dev_every``, at their training step)."""
    steps_file = layout.train_report / "steps.csv"
    if steps_file.exists() and steps_file.stat().st_size > 1:
        steps = pd.read_csv(steps_file)
        now = int(time.time() * 1000)
        metrics = [
            Metric(metric_name(f"train.{column}"), float(value), now, int(step))
            for column in steps.columns.drop("step")
            for step, value in zip(steps["step"], steps[column])
            if pd.notna(value)
        ]
        run_id = mlflow.active_run().info.run_id
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            MlflowClient().log_batch(run_id, metrics=metrics[start : start + 1000])
    metrics_file = layout.train_report / "metrics.json"
    summary = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    rounds = summary.get("rounds", [])
    for event in rounds:
        mlflow.log_metric("train.dev", event["dev"], step=event["round"])
        mlflow.log_metric("train.reclustered", float(event["reclustered"]), step=event["round"])
    if rounds:
        mlflow.set_tag("train.reclusterings", sum(e["reclustered"] for e in rounds[1:]))
    for event in summary.get("dev_scores", []):  # train.dev_every: at the training step scored
        mlflow.log_metric("train.dev", event["dev"], step=event["step"])


def register(params: Params, layout: Layout, tracking_uri: str | None = None, run_name: str | None = None) -> dict:
    """Log params, metrics, reports and the retriever; register it; set its alias."""
    configure(layout.root, params.registry.experiment, tracking_uri)
    eval_metrics = json.loads((layout.eval_report / "metrics.json").read_text())
    metric, kind = params.registry.metric, read_manifest(layout.retriever)["kind"]
    if metric not in eval_metrics:
        raise ValueError(f"registry.metric={metric!r} is not in {layout.eval_report / 'metrics.json'}")
    if eval_metrics.get("retriever") != kind:
        raise ValueError(f"{layout.eval_report / 'metrics.json'} evaluated the {eval_metrics.get('retriever')} "
                         f"retriever but {layout.retriever} holds a {kind} one: run the evaluate stage again")
    client = MlflowClient()
    name = params.registry.model_name
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(params).items()})
        mlflow.log_metrics(_numeric(eval_metrics, ""))
        summaries = {stage: json.loads(report.read_text()) for stage, report in
                     (("train.", layout.train_report / "metrics.json"), ("ingest.", layout.ingest_report / "summary.json"))
                     if report.exists()}
        for stage, summary in summaries.items():
            mlflow.log_metrics(_numeric(summary, stage))
        log_training_curves(layout)
        for directory in (layout.eval_report, layout.train_report, layout.final_tree):
            if directory.exists():
                mlflow.log_artifacts(str(directory), artifact_path=f"reports/{directory.name}")
        for name_in_report in ("summary.json", "expectations.json", "rejects.jsonl"):
            report = layout.ingest_report / name_in_report
            if report.exists():
                mlflow.log_artifact(str(report), artifact_path="reports/ingest")
        included = summaries.get("ingest.", {}).get("incoming_batches", [])
        data = load_ingested(layout.ingested)
        value = decision_value(load_retriever(layout.retriever, layout.encoder), params, data)
        decision = f"{params.registry.decision_split}.{metric_name(metric)}"
        mlflow.log_metric(decision, value)
        model_info = log_retriever(layout.encoder, layout.retriever, params.serve)
        # the champion check and the alias move are one step for every writer of this deployment
        # (incremental updates hold the same lock from their check to their alias move)
        with exclusive_lock(layout.deployments / ".lock"):
            previous_version, previous_value = champion_on_this_data(params, layout, data, tracking_uri)
            alias, reason = decide_alias(value, previous_value, params.registry.min_improvement)
            reason = f"{params.registry.decision_split} {metric}: {reason}"
            excluded = sorted({sha[:16] for sha in Inbox(layout.inbox).excluded()} & set(included))
            if excluded:  # ingested before a rollback excluded them: never served again through a retrain
                alias, reason = "challenger", f"holds batches a rollback excluded: {', '.join(excluded)}"
            tags = {"promotion": reason, "retriever": kind, "decision_split": params.registry.decision_split,
                    "included_batches": ",".join(included), "passage_text": PASSAGE_TEXT}
            if params.registry.decision_split == params.eval.split:  # the reported metric was also the deciding one
                tags["decided_on_reported_split"] = "true"
            tags.update(collection_tags(layout.retriever))  # index.backend: milvus: the collection it is a view of
            if alias == "champion" and previous_version is not None:
                tags["replaced_champion"] = str(previous_version)
            version = mlflow.register_model(model_info.model_uri, name, tags=tags).version  # tagged as it is created
            client.set_registered_model_alias(name, alias, version)
            follow_alias(name, alias, tags)
        if previous_value is not None:
            mlflow.log_metric(f"champion.{decision}", previous_value)  # what it was compared with
        mlflow.set_tags({"registered_version": version, "alias": alias, "retriever": kind})
    log.info("registered %s version %s as %s (%s)", name, version, alias, reason)
    result = {
        "run_id": run.info.run_id,
        "model_name": name,
        "version": int(version),
        "alias": alias,
        "reason": reason,
        "retriever": kind,
        "metric": metric,
        "decision_split": params.registry.decision_split,
        "value": value,  # on the decision split: what was compared
        "previous_champion_version": previous_version,
        "previous_champion_value": previous_value,
        "reported": {"split": eval_metrics["split"], metric: eval_metrics[metric]},  # reported, never decided on
        "model_uri": f"models:/{name}/{version}",
    }
    write_json(layout.registry_report / "registration.json", result)
    return result


def run(params: Params, layout: Layout) -> dict:
    """The pipeline's register stage (``fresh-registry register``, the Dagster asset registered_model)."""
    return register(params, layout)
