"""The freshness loop on a BEIR directory: a champion over the *old* documents, then the *new*
documents streamed through the inbox in batches, and finally one batch from another domain.

    python -m benchmarks.freshness --data ../shared/data/scifact [--batch-size 50]

Every batch goes the production path, in process: ``submit-documents`` -> inbox sensor tick ->
ingest/queries/drift-report run -> drift sensor tick -> ``incremental_update`` run (or a
requested ``full_retrain``, recorded, not executed). Per batch it records the decision, the
drift statistics, the time from the sensor tick to the batch being in the index version
(``searchable_s``) and to it being the registered champion (``registered_s``), and MRR@10 of the
old and of the (so far added) new documents' test queries on the deployed index. The champion is
zero-shot MiniLM (``--encoder`` for a trained one); the out-of-domain batch is documents of the
built-in docstring corpus. Writes ``benchmarks/results/<dataset>/freshness-loop.json`` (with the
commit and the resolved params; refused from uncommitted code unless ``--allow-dirty``, as
``benchmarks.run`` does) and a plot.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path

import dagster as dg
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import yaml

from benchmarks.run import PROJECT, checked_commit, machine
from model_code.cli import main as pipeline
from model_code.config import DefaultCorpusParams, deep_merge, load_params
from model_code.data.default_corpus import build_default_corpus
from model_code.data.ingested import load_ingested
from model_code.eval.metrics import evaluate, qrels_dict
from model_code.freshness.deployment import checkout
from model_code.freshness.inbox import Inbox
from model_code.incremental.updates import RetrieverVersions
from model_code.io import write_json, write_parquet
from model_code.layout import Layout
from model_code.retrievers import Retriever
from orchestration.jobs import INCOMING_ASSETS
from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource
from orchestration.sensors import drift_sensor, inbox_sensor
from tracking.deployment import MlflowRegistry
from tracking.registry import register

BATCH_ASSETS = [a for a in INCOMING_ASSETS if a.key.to_user_string() != "champion_update"]
UPDATE_ASSETS = [a for a in INCOMING_ASSETS if a.key.to_user_string() == "champion_update"]


def old_only_source(data_dir: Path, root: Path) -> tuple[Path, pd.DataFrame]:
    """Ingest the BEIR data once for its old/new/tune split; write a parquet source of the old
    documents (queries and qrels kept; qrels to other documents are rejected at ingestion)."""
    probe = root / "probe"
    probe.mkdir(parents=True)
    (probe / "params.yaml").write_text(yaml.safe_dump({"data": {"source": "beir", "path": str(data_dir)}}))
    assert pipeline(["ingest", "--params", str(probe / "params.yaml"), "--root", str(probe)]) == 0
    ingested = Layout(probe).ingested
    data = load_ingested(ingested)
    groups = pd.read_parquet(ingested / "doc_groups.parquet")
    old_ids = set(groups.loc[groups["group"] == "old", "doc_id"])
    source = root / "old_source"
    write_parquet(source / "corpus.parquet", data.corpus[data.corpus["doc_id"].isin(old_ids)])
    write_parquet(source / "queries.parquet", data.queries)
    for split, frame in data.qrels.items():
        write_parquet(source / "qrels" / f"{split}.parquet", frame)
    new_docs = data.corpus[data.corpus["doc_id"].isin(set(groups.loc[groups["group"] == "new", "doc_id"]))]
    return source, new_docs


def mrr(retriever: Retriever, queries: pd.DataFrame, qrels: pd.DataFrame) -> float | None:
    if qrels.empty:
        return None
    judged = queries[queries["query_id"].isin(set(qrels["query_id"]))]
    hits = retriever.search(judged["text"].tolist(), 10)
    run = {q: dict(zip(h.doc_ids, h.scores)) for q, h in zip(judged["query_id"], hits)}
    return evaluate(qrels_dict(qrels), run, ["mrr@10"])[0]["mrr@10"]


def write_jsonl(path: Path, documents: pd.DataFrame) -> Path:
    rows = [{"_id": d, "title": t, "text": x} for d, t, x in zip(documents["doc_id"], documents["title"], documents["text"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.freshness", description=__doc__)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--encoder", default="minilm")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--max-passage-length", type=int, default=256)
    parser.add_argument("--out", type=Path, default=PROJECT / "benchmarks" / "results")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write into benchmarks/results/ from uncommitted code (the results are marked dirty)")
    args = parser.parse_args(argv)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    root = Path(tempfile.mkdtemp(prefix="freshness-bench-"))
    source, new_docs = old_only_source(args.data.resolve(), root)
    workspace = root / "workspace"
    workspace.mkdir()
    params_file = workspace / "params.yaml"
    overrides = {
        "data": {"source": "parquet", "path": str(source)},
        "encoder": {"model": args.encoder, "max_passage_length": args.max_passage_length},
        "train": {"enabled": False},
    }
    params_file.write_text(yaml.safe_dump(deep_merge(yaml.safe_load((PROJECT / "params.yaml").read_text()), overrides)))
    params = load_params(params_file)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    start = time.perf_counter()
    for stage in ("ingest", "train", "index", "evaluate"):  # train with enabled: false saves the encoder as is
        assert pipeline([stage, "--params", str(params_file), "--root", str(workspace)]) == 0
    layout = Layout(workspace)
    register(params, layout, tracking_uri=uri)
    setup_seconds = time.perf_counter() - start
    resources = {"params": ParamsResource(path=str(params_file)), "workspace": WorkspaceResource(root=str(workspace)),
                 "mlflow_store": MlflowResource(tracking_uri=uri)}

    data = load_ingested(layout.ingested)
    test = data.qrels_for("test")
    indexed_old = set(data.corpus["doc_id"])
    relevant = test.groupby("query_id")["doc_id"].agg(set)
    old_qrels = test[test["query_id"].isin(relevant[relevant.map(lambda s: s <= indexed_old)].index)]
    full_test = pd.read_parquet(root / "probe" / "data" / "ingested" / "qrels" / "test.parquet")
    queries = pd.read_parquet(root / "probe" / "data" / "ingested" / "queries.parquet")
    relevant_all = full_test.groupby("query_id")["doc_id"].agg(set)

    ood = build_default_corpus(DefaultCorpusParams(max_documents=args.batch_size * 4)).corpus.head(args.batch_size)
    batches = [("scifact-new", new_docs.iloc[i : i + args.batch_size]) for i in range(0, len(new_docs), args.batch_size)]
    batches.append(("docstrings (other domain)", ood))
    inbox = Inbox(layout.inbox)
    rows, added, cursor = [], set(), None
    with dg.instance_for_test() as instance:
        for number, (kind, documents) in enumerate(batches, start=1):
            file = write_jsonl(root / f"batch-{number:03d}.jsonl", documents)
            submitted = inbox.submit(file)
            os.utime(submitted, (time.time() - 60, time.time() - 60))  # settled: the tick is the clock's zero
            tick = time.perf_counter()
            result = inbox_sensor(dg.build_sensor_context(instance=instance, resources=resources))
            for request in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            [request] = result.run_requests
            assert dg.materialize(BATCH_ASSETS, partition_key=request.partition_key, instance=instance,
                                  resources=resources).success
            reported = time.perf_counter()
            decision = drift_sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources))
            cursor = decision.cursor
            [launch] = decision.run_requests or [None]
            report = json.loads((layout.drift_reports / request.partition_key / "report.json").read_text())
            row = {"batch": number, "kind": kind, "documents": report["documents"], "decision": report["decision"],
                   "reasons": report["reasons"], "launched": launch.job_name if launch else None,
                   "drift_report_s": reported - tick, "statistics": report["statistics"]}
            if launch is not None and launch.job_name == "incremental_update":
                assert dg.materialize(UPDATE_ASSETS, partition_key=request.partition_key, instance=instance,
                                      resources=resources).success
                row["registered_s"] = time.perf_counter() - tick
                deployment, _ = checkout(MlflowRegistry(params, layout, uri), layout)
                manifest = RetrieverVersions(deployment).manifests()[-1]
                row["searchable_s"] = row["drift_report_s"] + manifest["total_ms"] / 1000
                added |= set(documents["doc_id"])
                retriever = RetrieverVersions(deployment).load()
                indexed = indexed_old | added
                new_queries = [q for q, docs in relevant_all.items() if docs & added and docs <= indexed]
                row["old_mrr@10"] = mrr(retriever, queries, old_qrels)
                row["new_mrr@10"] = mrr(retriever, queries, full_test[full_test["query_id"].isin(new_queries)])
                row["new_queries"] = len(new_queries)
            rows.append(row)
            print(f"batch {number:>3} {kind:<26} {row['decision']:<11} KS {report['statistics'].get('batch_similarity_ks', 0):.3f} "
                  f"PSI {report['statistics'].get('batch_cluster_psi', 0):.3f} "
                  f"searchable {row.get('searchable_s', float('nan')):.2f}s registered {row.get('registered_s', float('nan')):.2f}s "
                  f"old MRR {row.get('old_mrr@10') or float('nan'):.4f} new MRR {row.get('new_mrr@10') or float('nan'):.4f}")

    in_domain = [r for r in rows if r["kind"] == "scifact-new"]
    training_mrr = in_domain[0]["statistics"]["canary_mrr@10_at_training"]
    summary = {
        "dataset": args.data.name, "config": "freshness-loop",
        "metrics": {
            "batches": len(in_domain),
            "in_domain_retrains": sum(r["decision"] == "retrain" for r in in_domain),
            "ood_decision": rows[-1]["decision"],
            "searchable_s_median": float(pd.Series([r["searchable_s"] for r in in_domain if "searchable_s" in r]).median()),
            "searchable_s_max": max(r.get("searchable_s", 0) for r in in_domain),
            "registered_s_median": float(pd.Series([r["registered_s"] for r in in_domain if "registered_s" in r]).median()),
            "old_mrr@10_first": in_domain[0].get("old_mrr@10"),
            "old_mrr@10_last": in_domain[-1].get("old_mrr@10"),
            "canary_mrr@10_at_training": training_mrr,
            "canary_mrr@10_last": in_domain[-1]["statistics"]["canary_mrr@10"],
            "max_batch_similarity_ks_in_domain": max(r["statistics"]["batch_similarity_ks"] for r in in_domain),
            "ood_batch_similarity_ks": rows[-1]["statistics"]["batch_similarity_ks"],
            "max_batch_cluster_psi_in_domain": max(r["statistics"]["batch_cluster_psi"] for r in in_domain),
            "ood_batch_cluster_psi": rows[-1]["statistics"]["batch_cluster_psi"],
        },
        "batches": rows,
        "timings": {"setup": setup_seconds},
        "thresholds": params.freshness.thresholds.model_dump(),
        "encoder": args.encoder, "batch_size": args.batch_size,
        "machine": machine(), "date": dt.date.today().isoformat(),
        "commit": commit, "dirty": commit.endswith("+dirty"), "params": params.model_dump(mode="json"),
    }
    out = args.out / args.data.name
    write_json(out / "freshness-loop.json", summary)
    plot(rows, out / "freshness-loop.png")
    print(json.dumps(summary["metrics"], indent=2))
    return 0


def plot(rows: list[dict], path: Path) -> None:
    figure, (quality, drift) = plt.subplots(1, 2, figsize=(10, 3.5))
    updated = [r for r in rows if "old_mrr@10" in r]
    quality.plot([r["batch"] for r in updated], [r["old_mrr@10"] for r in updated], marker="o", label="old documents")
    judged = [r for r in updated if r["new_mrr@10"] is not None]  # no new test query before the first ones arrive
    quality.plot([r["batch"] for r in judged], [r["new_mrr@10"] for r in judged], marker="s", label="new documents")
    quality.set(xlabel="batch", ylabel="MRR@10 (test queries)", title="quality while streaming")
    quality.legend()
    colours = ["tab:red" if r["decision"] == "retrain" else "tab:green" for r in rows]
    drift.bar([r["batch"] for r in rows], [r["statistics"]["batch_similarity_ks"] for r in rows], color=colours)
    drift.set(xlabel="batch (red: retrain)", ylabel="KS, nearest-centroid cosine", title="embedding drift per batch")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
