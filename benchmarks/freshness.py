"""Calibrating the freshness thresholds on a BEIR directory (and the freshness loop's timings):
a champion over the *old* documents, the *new* documents streamed through the inbox in batches,
then batches from another domain.

    python -m benchmarks.freshness --data ../shared/data/scifact [--batch-size 20] [--zero-shot]

Every batch goes the production path, in process: ``submit-documents`` -> inbox sensor tick ->
the batch's run (ingest, queries, drift report, update) -> drift sensor tick (no retrain). The protocol,
fixed before any run (the rule is ``choose_thresholds``):

1. **Data.** The BEIR directory is ingested without its test qrels (``qrels/<eval.split>.tsv`` of
   the params is left out of the directory the pipeline reads), dev carved from train as the
   pipeline does (``data.dev_fraction``); its documents fall into old / new / tune by the
   pipeline's hash split (``data.split_fractions``). Nothing before step 5 can read the test qrels:
   they are not on the workspace's disk.
2. **Champion.** The pipeline's stages run with the params file's settings (``params.yaml``: the
   shipped training), only the data source (the old documents, train and dev qrels) and
   ``eval.split`` (dev, the test qrels being withheld) overridden, and the result is registered as
   the champion. ``--zero-shot`` skips training (MiniLM as is: the earlier protocol).
3. **Observe.** The new documents are streamed in ``len // --batch-size`` batches of near-equal
   size (none smaller than ``--batch-size``), in corpus order, then two other-domain batches: a
   *mixed* one (half SciFact *tune* documents, which are in no other batch, half docstrings of the
   built-in corpus) and a *docstring* one. The thresholds are set so that none can trip
   (``NEVER_RETRAIN``): every batch is applied incrementally, as every batch would be whatever the
   decision (a retrain is only requested, never executed here), and its drift statistics are
   recorded, together with each batch's search results for the queries without a train or dev
   judgement (for step 5).
4. **Choice** (``choose_thresholds``), from the first ``n // 2`` in-domain batches (the
   calibration half) and the canary at training, nothing else:

   * ``max_similarity_ks`` = the largest KS statistic the decision checks on a calibration batch
     (per batch, and cumulative since training; each only from ``min_batch_documents`` documents,
     as ``drift.decide`` checks them) x ``DRIFT_MARGIN`` (1.5), rounded up to 0.01, at most 1;
   * ``max_cluster_psi`` = the same for the cluster PSI;
   * ``max_canary_mrr_drop`` = ``CANARY_SE_MULTIPLE`` (2) x the standard error of the canary's
     per-query reciprocal rank (RR@10) on the champion at training (sample standard deviation
     over the canary's dev queries / sqrt(their number)), rounded up to 0.01: a smaller drop of
     the canary's mean is within its own sampling noise;
   * ``max_volume_ratio`` and ``max_unseparable_share`` are policies, not drift statistics (and
     IncDSI's share is not measured by a dense champion): they keep the params file's values.
5. **Scoring.** The chosen thresholds decide every recorded batch with ``drift.decide`` (the drift
   report's own function): false retrains on the held-out in-domain half, detection of each
   other-domain batch (and which of its reasons are per-batch statistics). Since a retrain is
   never executed in the stream, no batch's statistics depend on an earlier decision, so this
   replay is what a live run with these thresholds decides. The params file's thresholds are
   replayed the same way, for comparison. Only now is the BEIR directory ingested with its test
   qrels, to report MRR@10 of the old and of the (so far added) new documents' test queries after
   each batch; nothing is chosen from them.

Per batch it also records the time from the sensor tick to the batch being in the index version
(``searchable_s``) and to it being the registered champion (``registered_s``). Writes
``benchmarks/results/<dataset>/freshness-calibration.json`` (``-zero-shot`` with ``--zero-shot``;
with the commit, the resolved params, the chosen thresholds with their rule and inputs, the
per-batch statistics and the held-out outcomes; refused from uncommitted code unless
``--allow-dirty``, as ``benchmarks.run`` does) and a plot beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import tempfile
import time
from pathlib import Path

import dagster as dg
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import yaml

from benchmarks.configs import PARAMS_FILE
from benchmarks.freshness_stream import (
    NEVER_RETRAIN,
    BatchStream,
    beir_without,
    ingest,
    old_only_source,
    write_jsonl,
)
from benchmarks.harness import results_arguments
from benchmarks.run import checked_commit, machine, run_params
from model_code.config import DefaultCorpusParams, DriftThresholds, Params, deep_merge, load_params
from model_code.data.default_corpus import build_default_corpus
from model_code.data.ingested import load_ingested
from model_code.eval.metrics import evaluate, hits_to_run, qrels_dict, search_depth
from model_code.freshness.drift import DriftReference, canary_evaluation, decide
from model_code.freshness.report import reference_dir
from model_code.io import tree_sha256, write_json
from model_code.layout import Layout
from tracking.registry import register

# the rule (step 4 of the module docstring), fixed before any run
DRIFT_MARGIN = 1.5  # KS and PSI: the calibration half's largest checked value x this
CANARY_SE_MULTIPLE = 2.0  # canary MRR@10 drop: this x the standard error of its per-query RR@10 at training
ROUND_UP_TO = 0.01  # chosen values are rounded up to this step
RULE = (f"max_similarity_ks, max_cluster_psi: the largest value drift.decide checks (per batch and cumulative, "
        f"each from at least min_batch_documents documents) over the first half of the in-domain batches "
        f"(the calibration half) x {DRIFT_MARGIN}, rounded up to {ROUND_UP_TO} (KS at most 1); "
        f"max_canary_mrr_drop: {CANARY_SE_MULTIPLE} x the standard error (sample sd / sqrt(n)) of the canary's "
        f"per-query RR@10 on the champion at training, rounded up to {ROUND_UP_TO}; max_volume_ratio and "
        f"max_unseparable_share: the params file's values (policies, not drift statistics)")
IN_DOMAIN, MIXED, OTHER = "in-domain", "mixed (half docstrings)", "docstrings (other domain)"


# -- the rule ----------------------------------------------------------------------------------
def round_up(value: float, step: float = ROUND_UP_TO) -> float:
    """``value`` rounded up to a multiple of ``step`` (a value already on the grid stays)."""
    return round(math.ceil(round(value / step, 9)) * step, 10)


def checked_values(stats: dict[str, float], statistic: str, min_batch_documents: int) -> list[float]:
    """The values of ``batch_<statistic>`` and ``cumulative_<statistic>`` that ``drift.decide``
    checks: each only when its scope holds at least ``min_batch_documents`` documents."""
    scopes = (("batch", stats.get("batch_documents", 0)), ("cumulative", stats.get("added_since_training", 0)))
    return [stats[f"{scope}_{statistic}"] for scope, size in scopes
            if size >= min_batch_documents and f"{scope}_{statistic}" in stats]


def calibration_split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(calibration half, held-out half) of the in-domain batches, in stream order: the first
    ``n // 2`` batches calibrate, the rest are held out."""
    in_domain = [r for r in rows if r["kind"] == IN_DOMAIN]
    half = len(in_domain) // 2
    return in_domain[:half], in_domain[half:]


def choose_thresholds(rows: list[dict], canary_reciprocal_ranks: list[float], min_batch_documents: int,
                      policy: DriftThresholds) -> tuple[DriftThresholds, dict]:
    """The thresholds the rule picks, and the inputs it picked them from. Reads the calibration
    half of the in-domain ``rows`` (their ``statistics``) and the canary's per-query reciprocal
    ranks at training, nothing else; ``policy`` supplies the two thresholds not calibrated."""
    calibration, _ = calibration_split(rows)
    chosen, inputs = {}, {"calibration_batches": [r["batch"] for r in calibration]}
    for statistic, name, cap in (("similarity_ks", "max_similarity_ks", 1.0), ("cluster_psi", "max_cluster_psi", None)):
        values = [v for r in calibration for v in checked_values(r["statistics"], statistic, min_batch_documents)]
        if not values:
            raise ValueError(f"no calibration batch has {min_batch_documents} documents: {statistic} is not checked")
        value = round_up(max(values) * DRIFT_MARGIN)
        chosen[name] = min(value, cap) if cap is not None else value
        inputs[f"{statistic}_max"] = max(values)
    ranks = np.asarray(canary_reciprocal_ranks, dtype=float)
    if len(ranks) < 2:
        raise ValueError("the canary needs at least two queries for a standard error")
    standard_error = float(ranks.std(ddof=1) / math.sqrt(len(ranks)))
    chosen["max_canary_mrr_drop"] = round_up(CANARY_SE_MULTIPLE * standard_error)
    inputs.update(canary_queries=len(ranks), canary_mrr_at_training=float(ranks.mean()),
                  canary_rr_sd=float(ranks.std(ddof=1)), canary_mrr_standard_error=standard_error)
    thresholds = policy.model_copy(update=chosen)
    return DriftThresholds.model_validate(thresholds.model_dump()), inputs


def outcomes(rows: list[dict], thresholds: DriftThresholds, min_batch_documents: int) -> dict:
    """What ``thresholds`` decide for the recorded batches: per batch, and summed per part of the
    stream (calibration half, held-out half, each other-domain batch)."""
    decided = {r["batch"]: decide(r["statistics"], thresholds, min_batch_documents) for r in rows}
    calibration, held_out = calibration_split(rows)

    def part(batches: list[dict]) -> dict:
        retrains = [r["batch"] for r in batches if decided[r["batch"]][0] == "retrain"]
        return {"batches": len(batches), "retrains": len(retrains), "retrain_batches": retrains,
                "reasons": {str(b): decided[b][1] for b in retrains}}

    other = [{"batch": r["batch"], "kind": r["kind"], "documents": r["documents"], "decision": decided[r["batch"]][0],
              "reasons": decided[r["batch"]][1],
              "detected_by_batch_statistics": any(reason.startswith("batch_") for reason in decided[r["batch"]][1])}
             for r in rows if r["kind"] != IN_DOMAIN]
    return {"decisions": {str(b): d[0] for b, d in decided.items()}, "calibration_half": part(calibration),
            "held_out_half": part(held_out), "other_domain": other}


# -- the stream --------------------------------------------------------------------------------
def stream_batches(new_docs: pd.DataFrame, tune_docs: pd.DataFrame, batch_size: int) -> list[tuple[str, pd.DataFrame]]:
    """The new documents in ``len // batch_size`` near-equal batches, then the mixed and the
    docstring batch."""
    parts = np.array_split(np.arange(len(new_docs)), max(1, len(new_docs) // batch_size))
    batches = [(IN_DOMAIN, new_docs.iloc[p]) for p in parts]
    docstrings = build_default_corpus(DefaultCorpusParams(max_documents=max(100, batch_size * 4))).corpus
    half = min(batch_size // 2, len(tune_docs))
    if half:
        mixed = pd.concat([tune_docs.head(half), docstrings.head(batch_size - half)], ignore_index=True)
        batches.append((MIXED, mixed[["doc_id", "title", "text"]]))
    batches.append((OTHER, docstrings.iloc[batch_size - half: 2 * batch_size - half]))
    return batches


def champion_overrides(zero_shot: bool, max_passage_length: int | None) -> dict:
    """What the harness sets on top of the params file for the champion's workspace (its data path
    aside): recorded with the row, so that provenance re-resolves the params the row would get now."""
    overrides = {
        "data": {"source": "parquet", "include_incoming": False},
        "eval": {"split": "dev"},  # the test qrels are withheld; dev is also the decision split
        "freshness": {"thresholds": NEVER_RETRAIN.model_dump()},
    }
    if zero_shot:
        overrides["train"] = {"enabled": False}
    if max_passage_length is not None:
        overrides["encoder"] = {"max_passage_length": max_passage_length}
    return overrides


def expected_params(row: dict) -> list[tuple[dict | None, dict]]:
    """(params now, params recorded) for the champion (the shipped params.yaml with the row's
    overrides) and for the shipped file itself (its thresholds give the ``params_thresholds``
    outcomes, its eval.split the withheld qrels): the provenance check of a freshness row
    (``benchmarks.provenance``). None: the recorded overrides no longer validate."""
    shipped = yaml.safe_load(PARAMS_FILE.read_text())
    recorded = row["params"]
    pairs = [(deep_merge(deep_merge(shipped, row["overrides"]), {"data": {"path": recorded["data"]["path"]}}),
              recorded), (shipped, row["shipped_params"])]
    out = []
    for now, then in pairs:
        try:
            out.append((Params.model_validate(now).model_dump(mode="json"), then))
        except ValueError:  # a setting the row was run with has been removed or renamed since
            out.append((None, then))
    return out


def calibrate(data_dir: Path, base: dict, root: Path, batch_size: int, zero_shot: bool,
              max_passage_length: int | None) -> dict:
    """Steps 1-4 of the protocol: the champion, the observed stream and the chosen thresholds.
    Reads no test qrels (they are not on this workspace's disk)."""
    test_split = Params.model_validate(base).eval.split
    probe = ingest(base, beir_without(data_dir, test_split, root / "without-test"), root / "probe")
    source = root / "old_source"
    new_docs, tune_docs, unjudged = old_only_source(probe, source)
    workspace = root / "workspace"
    workspace.mkdir()
    params_file = workspace / "params.yaml"
    overrides = champion_overrides(zero_shot, max_passage_length)
    params_file.write_text(yaml.safe_dump(deep_merge(deep_merge(base, overrides), {"data": {"path": str(source)}})))
    params = load_params(params_file)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    start = time.perf_counter()
    dev_metrics, stage_seconds, training, _, _ = run_params(params, workspace)
    layout = Layout(workspace)
    register(params, layout, tracking_uri=uri)
    setup_seconds = time.perf_counter() - start

    batches = stream_batches(new_docs, tune_docs, batch_size)
    rows, runs = [], []
    ignore = params.eval.ignore_identical_ids
    with dg.instance_for_test() as instance:
        stream = BatchStream(params, params_file, layout, uri, instance)
        for number, (kind, documents) in enumerate(batches, start=1):
            applied = stream.apply(write_jsonl(root / f"batch-{number:03d}.jsonl", documents))
            report, versions = applied.report, applied.versions
            retriever = versions.load()
            hits = retriever.search(unjudged["text"].tolist(), search_depth(10, ignore))
            runs.append(hits_to_run(unjudged["query_id"].tolist(), [h.doc_ids for h in hits], [h.scores for h in hits],
                                    10, ignore))
            row = {"batch": number, "kind": kind, "documents": report["documents"],
                   "doc_ids": documents["doc_id"].tolist(), "observed_decision": report["decision"],
                   "drift_report_s": applied.drift_report_s, "searchable_s": applied.searchable_s,
                   "registered_s": applied.registered_s, "statistics": report["statistics"]}
            rows.append(row)
            s = report["statistics"]
            print(f"batch {number:>3} {kind:<26} {report['documents']:>3} docs KS {s.get('batch_similarity_ks', 0):.3f} "
                  f"(cum {s.get('cumulative_similarity_ks', 0):.3f}) PSI {s.get('batch_cluster_psi', 0):.3f} "
                  f"(cum {s.get('cumulative_cluster_psi', 0):.3f}) canary drop {s.get('canary_mrr_drop', 0):.4f} "
                  f"searchable {row['searchable_s']:.2f}s registered {row['registered_s']:.2f}s", flush=True)

    # the canary's per-query reciprocal ranks on the champion's training snapshot (the base version)
    reference = DriftReference.load(reference_dir(versions.layout))
    canary_means, canary_per_query = canary_evaluation(versions.load_version("base").vector_view().index, reference)
    assert math.isclose(canary_means["mrr@10"], reference.canary_at_training["mrr@10"], abs_tol=1e-9)
    min_batch = params.freshness.min_batch_documents
    policy = Params.model_validate(base).freshness.thresholds  # the params file's thresholds
    thresholds, inputs = choose_thresholds(rows, canary_per_query["mrr@10"].tolist(), min_batch, policy)
    return {"params": params, "rows": rows, "runs": runs, "thresholds": thresholds, "inputs": inputs,
            "policy": policy, "min_batch_documents": min_batch, "dev_metrics": dev_metrics,
            "training": training, "stage_seconds": stage_seconds, "setup_seconds": setup_seconds,
            "indexed_old": set(load_ingested(layout.ingested).corpus["doc_id"])}


def mrr(run: dict, qrels: pd.DataFrame) -> float | None:
    if qrels.empty:
        return None
    judged = qrels_dict(qrels)
    return evaluate(judged, {q: run.get(q, {}) for q in judged}, ["mrr@10"])[0]["mrr@10"]


def report_test(calibration: dict, data_dir: Path, base: dict, root: Path) -> None:
    """Step 5's test report: only now are the test qrels read; adds old/new test MRR@10 per batch."""
    test_split = Params.model_validate(base).eval.split
    test = load_ingested(ingest(base, data_dir, root / "with-test").ingested).qrels_for(test_split)
    test = test[test["relevance"] > 0]
    relevant = test.groupby("query_id")["doc_id"].agg(set)
    indexed = set(calibration["indexed_old"])
    old_qrels = test[test["query_id"].isin(relevant[relevant.map(lambda s: s <= indexed)].index)]
    added: set[str] = set()
    for row, run in zip(calibration["rows"], calibration["runs"]):
        added |= set(row["doc_ids"])
        indexed |= set(row["doc_ids"])
        new_queries = [q for q, docs in relevant.items() if docs & added and docs <= indexed]
        row["test_old_mrr@10"] = mrr(run, old_qrels)
        row["test_new_mrr@10"] = mrr(run, test[test["query_id"].isin(new_queries)])
        row["test_new_queries"] = len(new_queries)
    calibration["test_old_queries"] = int(old_qrels["query_id"].nunique())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.freshness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--params", type=Path, default=PARAMS_FILE,
                        help="the settings the champion is built with (default: the shipped params.yaml)")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--zero-shot", action="store_true",
                        help="no training: the champion is the encoder as is (the earlier protocol)")
    parser.add_argument("--max-passage-length", type=int, default=None,
                        help="encoder.max_passage_length (default: the params file's)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="an empty or new directory for the workspaces (default: a new temporary one)")
    results_arguments(parser)
    args = parser.parse_args(argv)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    base = yaml.safe_load(args.params.read_text())
    data_dir = args.data.resolve()
    root = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="freshness-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        parser.error(f"--workdir {root} is not empty")
    result = calibrate(data_dir, base, root, args.batch_size, args.zero_shot, args.max_passage_length)
    report_test(result, data_dir, base, root)  # after the choice: the only reader of the test qrels

    rows, thresholds, min_batch = result["rows"], result["thresholds"], result["min_batch_documents"]
    chosen, previous = outcomes(rows, thresholds, min_batch), outcomes(rows, result["policy"], min_batch)
    for row in rows:
        row["decision"] = chosen["decisions"][str(row["batch"])]
        row["decision_with_params_thresholds"] = previous["decisions"][str(row["batch"])]
        del row["doc_ids"]
    calibration_rows, held_out_rows = calibration_split(rows)
    in_domain = calibration_rows + held_out_rows

    def largest(statistic: str, batches: list[dict]) -> float:
        return max(v for r in batches for v in checked_values(r["statistics"], statistic, min_batch))

    timed = pd.DataFrame([{k: r[k] for k in ("searchable_s", "registered_s")} for r in in_domain])
    config = "freshness-calibration" + ("-zero-shot" if args.zero_shot else "")
    summary = {
        "dataset": args.data.name, "config": config,
        "thresholds": thresholds.model_dump(),
        "rule": {"text": RULE, "drift_margin": DRIFT_MARGIN, "canary_se_multiple": CANARY_SE_MULTIPLE,
                 "round_up_to": ROUND_UP_TO, "min_batch_documents": min_batch, **result["inputs"]},
        # what the chosen thresholds decide: the held-out half and the other-domain batches are the test
        "outcomes": {k: chosen[k] for k in ("held_out_half", "other_domain", "calibration_half")},
        "params_thresholds": {"thresholds": result["policy"].model_dump(),
                              **{k: previous[k] for k in ("held_out_half", "other_domain", "calibration_half")}},
        "metrics": {
            "batches": len(in_domain), "calibration_batches": len(calibration_rows),
            "held_out_batches": len(held_out_rows),
            "batch_documents_min": min(r["documents"] for r in in_domain),
            "batch_documents_max": max(r["documents"] for r in in_domain),
            "new_documents": sum(r["documents"] for r in in_domain),
            "trained_documents": in_domain[0]["statistics"]["trained_documents"],
            "volume_ratio_last_in_domain": in_domain[-1]["statistics"]["volume_ratio"],
            "held_out_false_retrains": chosen["held_out_half"]["retrains"],
            "calibration_half_retrains": chosen["calibration_half"]["retrains"],
            "other_domain_detected": sum(o["decision"] == "retrain" for o in chosen["other_domain"]),
            "other_domain_batches": len(chosen["other_domain"]),
            "params_thresholds_in_domain_retrains": previous["calibration_half"]["retrains"]
            + previous["held_out_half"]["retrains"],
            "similarity_ks_max_calibration": largest("similarity_ks", calibration_rows),
            "similarity_ks_max_held_out": largest("similarity_ks", held_out_rows),
            "cluster_psi_max_calibration": largest("cluster_psi", calibration_rows),
            "cluster_psi_max_held_out": largest("cluster_psi", held_out_rows),
            "canary_mrr@10_at_training": in_domain[0]["statistics"]["canary_mrr@10_at_training"],
            "canary_mrr@10_last_in_domain": in_domain[-1]["statistics"]["canary_mrr@10"],
            "canary_mrr_drop_max_in_domain": max(r["statistics"]["canary_mrr_drop"] for r in in_domain),
            "searchable_s_median": float(timed["searchable_s"].median()), "searchable_s_max": float(timed["searchable_s"].max()),
            "registered_s_median": float(timed["registered_s"].median()),
            "dev_metrics_at_training": result["dev_metrics"],
            "test_old_queries": result["test_old_queries"],
            "test_old_mrr@10_first": in_domain[0]["test_old_mrr@10"], "test_old_mrr@10_last": in_domain[-1]["test_old_mrr@10"],
            "test_new_mrr@10_last": in_domain[-1]["test_new_mrr@10"], "test_new_queries_last": in_domain[-1]["test_new_queries"],
        },
        "batches": rows,
        "training": result["training"], "zero_shot": args.zero_shot, "batch_size": args.batch_size,
        "timings": {"setup": result["setup_seconds"], **result["stage_seconds"]},
        "machine": machine(), "date": dt.date.today().isoformat(),
        "commit": commit, "dirty": commit.endswith("+dirty"), "dataset_sha256": tree_sha256(data_dir),
        "params": result["params"].model_dump(mode="json"),
    }
    if args.params.resolve() == PARAMS_FILE.resolve():  # provenance re-resolves only the shipped file
        summary["overrides"] = champion_overrides(args.zero_shot, args.max_passage_length)
        summary["shipped_params"] = Params.model_validate(base).model_dump(mode="json")
    out = args.out / args.data.name
    write_json(out / f"{config}.json", summary)
    plot(summary, out / f"{config}.png")
    print(json.dumps({"thresholds": summary["thresholds"], "rule_inputs": summary["rule"],
                      "metrics": summary["metrics"]}, indent=2, default=str))
    return 0


def plot(summary: dict, path: Path) -> None:
    rows, thresholds = summary["batches"], summary["thresholds"]
    figure, (quality, ks, canary) = plt.subplots(1, 3, figsize=(15, 3.8))
    in_domain = [r for r in rows if r["kind"] == IN_DOMAIN]
    quality.plot([r["batch"] for r in in_domain], [r["test_old_mrr@10"] for r in in_domain], marker="o",
                 label="old documents")
    judged = [r for r in in_domain if r["test_new_mrr@10"] is not None]
    quality.plot([r["batch"] for r in judged], [r["test_new_mrr@10"] for r in judged], marker="s", label="new documents")
    quality.set(xlabel="batch", ylabel="MRR@10 (test queries, reported only)", title="quality while streaming")
    quality.legend()
    held_out_start = summary["rule"]["calibration_batches"][-1] + 0.5
    colours = {IN_DOMAIN: "tab:blue", MIXED: "tab:orange", OTHER: "tab:red"}
    for axis, key, limit, label in ((ks, "similarity_ks", thresholds["max_similarity_ks"], "KS, nearest-centroid cosine"),
                                    (canary, "canary_mrr_drop", thresholds["max_canary_mrr_drop"], "canary MRR@10 drop")):
        name = f"batch_{key}" if key != "canary_mrr_drop" else key
        axis.bar([r["batch"] for r in rows], [r["statistics"][name] for r in rows],
                 color=[colours[r["kind"]] for r in rows])
        if key == "similarity_ks":
            axis.plot([r["batch"] for r in rows], [r["statistics"]["cumulative_similarity_ks"] for r in rows], "k.",
                      label="cumulative")
            axis.legend()
        axis.axhline(limit, color="black", linestyle="--")
        axis.axvline(held_out_start, color="grey", linestyle=":")
        axis.set(xlabel="batch (blue: in-domain, orange: mixed, red: docstrings; dotted: held-out from here)",
                 ylabel=label, title=f"{label} (dashed: chosen threshold)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
