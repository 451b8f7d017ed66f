"""The freshness loop's production path for one batch, timed: what ``benchmarks.freshness``
(threshold calibration) and ``benchmarks.freshness_latency`` (seconds to searchable per retriever
kind) both stream new documents through.

A batch goes ``Inbox.submit`` -> inbox sensor tick -> the batch's run (ingest, queries, drift
report, the ``champion_update`` asset: an incremental version, registered) -> drift sensor tick
(which must ask for no retrain), in process, under one Dagster test instance. The clock starts at
the inbox sensor's tick.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import yaml

from model_code.cli import main as pipeline
from model_code.config import DriftThresholds, Params, deep_merge
from model_code.data.ingested import load_ingested
from model_code.freshness.deployment import checkout
from model_code.freshness.inbox import Inbox
from model_code.io import write_parquet
from model_code.layout import Layout
from model_code.versions.chain import RetrieverVersions
from orchestration.jobs import INCOMING_ASSETS
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
from orchestration.sensors import drift_sensor, inbox_sensor
from tracking.deployment import MlflowRegistry

# thresholds none of the statistics can exceed (KS <= 1, an MRR drop <= 1, a share <= 1): every
# batch goes the incremental path, whatever its drift
NEVER_RETRAIN = DriftThresholds(max_volume_ratio=1e9, max_similarity_ks=1.0, max_cluster_psi=1e9,
                                max_canary_mrr_drop=1.0, max_unseparable_share=1.0)


def beir_without(data_dir: Path, split: str, target: Path) -> Path:
    """``data_dir`` as a directory of links without ``qrels/<split>.tsv``."""
    (target / "qrels").mkdir(parents=True)
    for path in data_dir.iterdir():
        if path.is_file():
            (target / path.name).symlink_to(path.resolve())
    for path in (data_dir / "qrels").glob("*.tsv"):
        if path.name != f"{split}.tsv":
            (target / "qrels" / path.name).symlink_to(path.resolve())
    return target


def ingest(base: dict, data_dir: Path, root: Path) -> Layout:
    """The pipeline's ingest stage on a BEIR directory, with the params file's data settings."""
    root.mkdir(parents=True)
    params = deep_merge(base, {"data": {"source": "beir", "path": str(data_dir), "include_incoming": False}})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert pipeline(["ingest", "--params", str(root / "params.yaml"), "--root", str(root)]) == 0
    return Layout(root)


def old_only_source(probe: Layout, source: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A parquet source of the old documents (every query, the probe's qrels to old documents: train
    and dev); returns the new and the tune documents and the
    queries without a train or dev judgement (those whose results are kept per batch)."""
    data = load_ingested(probe.ingested)
    groups = pd.read_parquet(probe.ingested / "doc_groups.parquet")
    group = dict(zip(groups["doc_id"], groups["group"]))
    in_group = {g: data.corpus[data.corpus["doc_id"].map(group) == g] for g in ("old", "new", "tune")}
    write_parquet(source / "corpus.parquet", in_group["old"])
    write_parquet(source / "queries.parquet", data.queries)
    judged = set()
    for split, frame in data.qrels.items():
        write_parquet(source / "qrels" / f"{split}.parquet", frame[frame["doc_id"].isin(in_group["old"]["doc_id"])])
        judged |= set(frame["query_id"])
    return in_group["new"], in_group["tune"], data.queries[~data.queries["query_id"].isin(judged)]


def write_jsonl(path: Path, documents: pd.DataFrame) -> Path:
    rows = [{"_id": d, "title": t, "text": x} for d, t, x in zip(documents["doc_id"], documents["title"], documents["text"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@dataclass
class AppliedBatch:
    """One batch through the loop: its drift report, the seconds from the inbox sensor's tick to
    the report (``drift_report_s``), the update's own (``update_s``: its manifest's ``total_ms``,
    the new version's save not counted), the seconds from the tick to the registered champion
    (``registered_s``), and the deployed versions afterwards."""

    report: dict
    drift_report_s: float
    update_s: float
    registered_s: float
    versions: RetrieverVersions

    @property
    def searchable_s(self) -> float:
        """Tick to a new index version holding the batch: a lower bound (its save not counted)."""
        return self.drift_report_s + self.update_s


class BatchStream:
    """Applies batches to the champion registered from ``params_file``'s workspace ``layout``,
    with thresholds that must never ask for a retrain (every batch goes the incremental path)."""

    def __init__(self, params: Params, params_file: Path, layout: Layout, tracking_uri: str,
                 instance: dg.DagsterInstance):
        self.params, self.layout, self.uri, self.instance = params, layout, tracking_uri, instance
        self.inbox, self.cursor = Inbox(layout.inbox), None
        self.resources = {"params": ParamsResource(path=str(params_file)),
                          "workspace": WorkspaceResource(root=str(layout.root)),
                          "mlflow_store": MlflowResource(tracking_uri=tracking_uri)}

    def apply(self, file: Path) -> AppliedBatch:
        submitted, _ = self.inbox.submit(file)
        os.utime(submitted, (time.time() - 60, time.time() - 60))  # settled: the tick is the clock's zero
        tick = time.time()
        result = inbox_sensor(dg.build_sensor_context(instance=self.instance, resources=self.resources))
        for request in result.dynamic_partitions_requests:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        [request] = result.run_requests
        run = dg.materialize(INCOMING_ASSETS, partition_key=request.partition_key, instance=self.instance,
                             resources=self.resources)
        registered = time.time() - tick
        assert run.success and run.asset_materializations_for_node("champion_update")
        [reported] = [e.timestamp for e in self.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
                      if e.step_key == "drift_report"]
        decision = drift_sensor(dg.build_sensor_context(instance=self.instance, cursor=self.cursor,
                                                        resources=self.resources))
        self.cursor = decision.cursor
        assert not decision.run_requests, decision.run_requests  # the thresholds never ask for a retrain
        report = json.loads((self.layout.drift_reports / request.partition_key / "report.json").read_text())
        deployment, _ = checkout(MlflowRegistry(self.params, self.layout, self.uri), self.layout)
        versions = RetrieverVersions(deployment)
        manifest = versions.manifests()[-1]
        return AppliedBatch(report, reported - tick, manifest["total_ms"] / 1000, registered, versions)
