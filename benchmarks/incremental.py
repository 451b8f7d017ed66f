"""IncDSI evaluation protocol (IncDSI Fig. 3-4, Tables 7-8 analogue) on a BEIR directory.

    python -m benchmarks.incremental --data ../shared/data/scifact [--new-share 0.3] [--orders 5]

The corpus is split by the ingestion stage into old / new / tune documents (``--new-share`` of it
new: SciFact needs ~0.3 for 80 test queries on new documents). Like for like, every method uses
the same encoder: the paper's D0 model, the base encoder fine-tuned by the train stage on the old
documents and their train queries only (``--zero-shot`` skips that). A document-id head is built
over the old documents (rows from document embeddings, CE fine-tuning on natural train + generated
queries), then the new documents arrive with generated queries only, as a deployed addition does
(each one's last generated query is held out for the unseen-query evaluation), and are added in
``--orders`` random orders by

* ``incdsi``: one L-BFGS-optimised head row per document (the method under test);
* ``dense-add``: ``add_with_ids`` of their vectors into a FAISS index over the old documents;
* ``head-finetune``: rows from their embeddings (scaled to the trained rows' median norm), then one
  epoch of CE on all queries;
* ``full-retrain``: the head rebuilt and fine-tuned over old + new from scratch.

The addition hyper-parameters are first tuned as the index stage tunes them (optuna TPE, F5 of
old/new MRR@10 on a simulated addition of the tune documents plus held-out old documents;
``--trials``). Scored (trec_eval's measures) on the test split's natural queries (each with every relevant
document: ``old`` = all relevant documents old, ``new`` = one of them added) and on the held-out
generated queries of the new documents (``new_unseen``): Hits@1, Hits@10, MRR@10, each query's
value averaged over the orders, with 95 % bootstrap intervals over queries. Speed: the paper's
mean (total time / documents) beside median and p95, every per-document time saved, the head's
rows × dimension and the machine, and one order re-run with every row in the optimisation
(``full_rows``: its timings and how far its rows are from the active set's). IncDSI is compared
with each other method query by query (``paired`` in its file: the difference, its bootstrap
interval and a paired permutation p-value). Writes
``benchmarks/results/<dataset>/{incdsi,dense-add,head-finetune,full-retrain}.json``, each method's
per-query values after every addition (``per_query/<method>.csv``: group, query, metrics) and a
plot; each records the commit and the resolved params and, like ``benchmarks.run``, is refused
from uncommitted code unless ``--allow-dirty``.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import functools
import hashlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import yaml
from scipy.stats import bootstrap

from benchmarks.compare import paired_difference
from benchmarks.harness import results_arguments
from benchmarks.run import PROJECT, checked_commit, machine
from model_code.cli import main as pipeline
from model_code.config import Params, deep_merge, load_params
from model_code.data.generator import generate_queries
from model_code.data.ingested import IngestedData, load_ingested
from model_code.eval.metrics import evaluate
from model_code.io import atomic_path, write_json, write_parquet
from model_code.layout import Layout
from model_code.methods.incdsi.build import head_queries, tuned_addition
from model_code.methods.incdsi.head import INITS, AdditionParams, IncDSIHead
from model_code.methods.incdsi.head_training import finetune_head, train_head
from model_code.methods.incdsi.settings import IncDSIParams
from model_code.methods.incdsi.tuning import OBJECTIVES
from model_code.models.encoder import Encoder
from model_code.stages import ingest
from model_code.stores.faiss_store import FaissStore

METRICS = ["hit_rate@1", "hit_rate@10", "mrr@10"]


@dataclass
class QuerySet:
    """Queries scored as one group: their vectors, ids and every relevant document of each."""

    vectors: torch.Tensor
    ids: list[str]
    qrels: dict[str, dict[str, int]]


def natural_queries(data: IngestedData, groups: dict[str, str], vectors: dict[str, torch.Tensor],
                    indexed: set[str], added: set[str]) -> dict[str, QuerySet]:
    """The test split's natural queries whose relevant documents are all indexed: ``old`` those
    with only old relevant documents, ``new`` those with at least one added one. Each keeps every
    relevant document (a hit on any of them counts), as trec_eval and BEIR score them."""
    test = data.qrels_for("test")
    test = test[test["relevance"] > 0]
    relevant = test.groupby("query_id")["doc_id"].agg(set)
    out = {}
    for group, wanted in (("old", lambda docs: not docs & added and all(groups[d] == "old" for d in docs)),
                          ("new", lambda docs: bool(docs & added))):
        ids = [q for q, docs in relevant.items() if docs <= indexed and wanted(docs)]
        out[group] = QuerySet(torch.stack([vectors[q] for q in ids]) if ids else torch.empty(0),
                              ids, {q: {d: 1 for d in relevant[q]} for q in ids})
    return out


def held_out_generated(generated: pd.DataFrame, doc_ids: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(addition queries, held-out queries) of new documents: each document's last generated query
    is held out for the unseen-query evaluation (the IncDSI reference code's), the rest add it; a
    document with a single generated query keeps it for its addition and has no held-out one."""
    mine = generated[generated["doc_id"].isin(set(doc_ids))].reset_index(drop=True)
    last = ~mine.duplicated("doc_id", keep="last") & (mine.groupby("doc_id")["doc_id"].transform("size") > 1)
    return mine[~last].reset_index(drop=True), mine[last].reset_index(drop=True)


def scores(search, queries: QuerySet) -> pd.DataFrame:
    """Per-query Hits@1, Hits@10, MRR@10 of ``search`` (query vectors -> scores, ids) on ``queries``."""
    if not queries.ids:
        return pd.DataFrame(columns=METRICS)
    found, ids = search(queries.vectors)
    run = {q: dict(zip(r, s.tolist())) for q, r, s in zip(queries.ids, ids, found)}
    return evaluate(queries.qrels, run, METRICS)[1].set_index("query_id")[METRICS]


def with_interval(per_query: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Mean of each metric over queries with its 95% bootstrap interval (percentile, 10,000 resamples)."""
    out = {}
    for metric in METRICS:
        values = per_query[metric].to_numpy(dtype=float)
        if len(values) < 2:
            out[metric] = {"mean": float(values.mean()) if len(values) else float("nan"), "queries": len(values)}
            continue
        interval = bootstrap((values,), np.mean, n_resamples=10_000, method="percentile",
                             random_state=np.random.default_rng(0)).confidence_interval
        out[metric] = {"mean": float(values.mean()), "ci95": [float(interval.low), float(interval.high)],
                       "queries": len(values)}
    return out


def speed(per_document_ms: list[float]) -> dict[str, float]:
    """The paper's figure (mean = total time / documents) beside the median and the 95th percentile."""
    times = np.asarray(per_document_ms)
    return {"add_ms_mean": float(times.sum() / len(times)), "add_ms_median": float(np.median(times)),
            "add_ms_p95": float(np.percentile(times, 95))}


def cached_encode(encoder: Encoder, name: str, side: str, texts: list[str], max_length: int, batch_size: int,
                  desc: str | None) -> torch.Tensor:
    """Encodings of ``side``'s texts (query or passage: an untied encoder has one transformer each)
    are reused across runs (``.cache/benchmarks``), keyed by model, side, length and texts: re-running
    the protocol after changing the addition code then takes minutes, not a quarter hour."""
    key = hashlib.sha256("\x00".join([name, side, str(max_length), *texts]).encode()).hexdigest()[:24]
    path = PROJECT / ".cache" / "benchmarks" / f"{key}.pt"
    if path.exists():
        return torch.load(path)
    vectors = torch.from_numpy(encoder.encode(texts, max_length, batch_size, desc=desc, side=side))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(vectors, path)
    return vectors


def model_fingerprint(model: str) -> str:
    """A name for the encoder's cached encodings: the bundled model's name, or a trained model's
    weights digest, an untied query side's included (a D0 model is retrained in a fresh directory
    every run)."""
    weights = sorted(Path(model).glob("**/*.safetensors")) if Path(model).is_dir() else []
    return hashlib.sha256(b"".join(w.read_bytes() for w in weights)).hexdigest()[:16] if weights else model


def d0_encoder(params: Params, data: IngestedData, old_ids: list[str], workdir: Path) -> str:
    """The IncDSI paper's D0 model: the encoder fine-tuned by the train stage (params.yaml's
    training, dev carved from train, never test) on the *old* documents and their train queries."""
    source, workspace = workdir / "old_source", workdir / "d0"
    old = data.corpus[data.corpus["doc_id"].isin(set(old_ids))]
    write_parquet(source / "corpus.parquet", old)
    write_parquet(source / "queries.parquet", data.queries)
    for split in ("train", "dev"):  # the dev queries the training selects its checkpoint on, as carved at ingestion
        qrels = data.qrels_for(split)
        write_parquet(source / "qrels" / f"{split}.parquet", qrels[qrels["doc_id"].isin(set(old_ids))])
    workspace.mkdir(parents=True)
    params_file = workspace / "params.yaml"
    params_file.write_text(yaml.safe_dump(deep_merge(params.model_dump(mode="json"), {
        "data": {"source": "parquet", "path": str(source)}, "train": {"enabled": True}})))
    for stage in ("ingest", "train"):
        if pipeline([stage, "--params", str(params_file), "--root", str(workspace)]) != 0:
            raise RuntimeError(f"the D0 model's {stage} stage failed (see above)")
    return str(Layout(workspace).encoder)


def incdsi_config(trials: int, default_trials: int, objective: str, beta: float, init: str | None) -> str:
    """The results name of an IncDSI run: ``incdsi`` for the defaults, else named by what differs."""
    if not trials:
        name = "incdsi-untuned"
    elif objective == "constrained":
        name = "incdsi-constrained"
    elif beta != 5:
        name = f"incdsi-beta{beta:g}"
    else:
        name = "incdsi" if trials == default_trials else f"incdsi-trials{trials}"
    return name + (f"-init{init}" if init and init != IncDSIParams().init else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.incremental", description=__doc__)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--encoder", default="minilm", help="base encoder; the D0 model is trained from it")
    parser.add_argument("--zero-shot", action="store_true", help="skip the D0 training: every method uses the base "
                        "encoder as it is (results get a -zeroshot suffix)")
    parser.add_argument("--new-share", type=float, default=0.3, help="share of the corpus held back as new documents "
                        "(data.split_fractions.new; SciFact needs ~0.3 for 80 test queries on new documents)")
    parser.add_argument("--orders", type=int, default=5, help="random orders the new documents are added in")
    parser.add_argument("--queries-per-document", type=int, default=5)
    parser.add_argument("--trials", type=int, default=None, help="optuna trials of the tuning (default: incdsi.tune_trials; "
                        "0: params.yaml's addition values); another count writes incdsi-trials<N>.json")
    parser.add_argument("--beta", type=float, default=5.0, help="F_beta of the tuning (IncDSI: 5); other values "
                        "write incdsi-beta<B>.json")
    parser.add_argument("--objective", choices=OBJECTIVES, default="fbeta",
                        help="tuning objective (incdsi.tune_objective); constrained writes incdsi-constrained.json")
    parser.add_argument("--init", choices=INITS, default=None,
                        help="start of each new row (default params.yaml's); with --trials 0 a non-default "
                        "value writes incdsi-untuned-init<I>.json")
    results_arguments(parser)
    args = parser.parse_args(argv)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    tune_share = load_params(PROJECT / "params.yaml").data.split_fractions["tune"]
    params = load_params(PROJECT / "params.yaml", {
        "data": {"source": "beir", "path": str(args.data.resolve()),
                 "split_fractions": {"old": 1 - args.new_share - tune_share, "new": args.new_share, "tune": tune_share}},
        "encoder": {"model": args.encoder, "max_passage_length": 256, "max_query_length": 64},
        "querygen": {"generator": {"queries_per_document": args.queries_per_document}},
        **({"retriever": {"incdsi": {"init": args.init}}} if args.init else {}),
    })
    incdsi_params = params.retriever.settings("incdsi")
    dataset = args.data.resolve().name
    with tempfile.TemporaryDirectory() as tmp:
        layout = Layout(tmp)
        ingest.run(params, layout)
        data = load_ingested(layout.ingested)
        groups = dict(pd.read_parquet(layout.ingested / "doc_groups.parquet").values)
        generated = generate_queries(data.corpus, params.querygen.generator, Path(tmp) / "cache.parquet")
        doc_ids = data.corpus["doc_id"].tolist()
        old_ids = [d for d in doc_ids if groups[d] == "old"]
        new_ids = [d for d in doc_ids if groups[d] == "new"]
        start = time.perf_counter()
        model = params.encoder.model if args.zero_shot else d0_encoder(params, data, old_ids, Path(tmp))
        d0_seconds = time.perf_counter() - start
        encoder = Encoder(model, params.encoder.pooling)
        encode = functools.partial(cached_encode, encoder, model_fingerprint(model))
        vectors = encode("passage", data.passages(), 256, 64, "encoding corpus")
    row = {d: i for i, d in enumerate(doc_ids)}
    additions, held_out = held_out_generated(generated, new_ids)
    # old (and tune) documents have their natural train and generated queries; new documents arrive
    # with generated queries only, as a deployed addition does, and every method gets those
    pairs = pd.concat([head_queries(data, generated, [d for d in doc_ids if groups[d] != "new"]),
                       additions.assign(natural=False)[["doc_id", "query", "natural"]]], ignore_index=True)
    pair_vectors = encode("query", pairs["query"].tolist(), 64, 128, "encoding head queries")
    is_addition = pairs["doc_id"].isin(set(new_ids)).to_numpy()
    addition_vectors, owner = pair_vectors[torch.from_numpy(is_addition)], pairs["doc_id"].to_numpy()[is_addition]
    text = dict(zip(data.queries["query_id"], data.queries["text"]))
    test_ids = sorted(set(data.qrels_for("test")["query_id"]))
    test_vectors = dict(zip(test_ids, encode("query", [text[q] for q in test_ids], 64, 128, None)))
    unseen = QuerySet(encode("query", held_out["query"].tolist(), 64, 128, None),
                      [f"held-out:{d}" for d in held_out["doc_id"]],
                      {f"held-out:{d}": {d: 1} for d in held_out["doc_id"]})

    def evaluation(search, added: list[str]) -> dict[str, pd.DataFrame]:
        added_set = set(added)
        queries = natural_queries(data, groups, test_vectors, set(old_ids) | added_set, added_set)
        held = [i for i, q in enumerate(unseen.ids) if q.removeprefix("held-out:") in added_set]
        return {"old": scores(search, queries["old"]), "new": scores(search, queries["new"]),
                "new_unseen": scores(search, QuerySet(unseen.vectors[held], [unseen.ids[i] for i in held],
                                                      {unseen.ids[i]: unseen.qrels[unseen.ids[i]] for i in held}))}

    def head_for(ids: list[str], epochs: int):
        mask = pairs["doc_id"].isin(set(ids)).to_numpy()
        head, rows, _ = train_head(vectors[[row[d] for d in ids]], ids, pair_vectors[mask], pairs["doc_id"][mask].tolist(),
                                   epochs, incdsi_params.head_learning_rate)
        return head, pair_vectors[mask], rows

    start = time.perf_counter()
    base_head, _, _ = head_for(old_ids, incdsi_params.head_epochs)
    head_seconds = time.perf_counter() - start
    checkpoints = sorted({10, 100, len(new_ids)} & set(range(1, len(new_ids) + 1)))
    tune_ids = [d for d in doc_ids if groups[d] == "tune"]
    on_tuning = pairs["doc_id"].isin(set(old_ids + tune_ids)).to_numpy()
    trials = incdsi_params.tune_trials if args.trials is None else args.trials
    chosen = tuned_addition(incdsi_params.model_copy(update={"tune_trials": trials, "tune_beta": args.beta,
                                                         "tune_objective": args.objective}),
                            vectors[[row[d] for d in old_ids]], old_ids, vectors[[row[d] for d in tune_ids]], tune_ids,
                            pairs[on_tuning].reset_index(drop=True), pair_vectors[on_tuning])
    addition, tuning = AdditionParams(**chosen["params"]), chosen.get("trials", [])

    def add_in_order(order: list[str], active_rows: int | None = None) -> tuple[IncDSIHead, list[dict], list[float], int]:
        """IncDSI additions in ``order``, timed per document (the optimisation only, as the paper)."""
        head, curve, timings, failures = copy.deepcopy(base_head), [], [], 0
        if active_rows is not None:
            head.ACTIVE_ROWS = active_rows
        for n, doc_id in enumerate(order, start=1):
            queries, document = addition_vectors[torch.from_numpy(owner == doc_id)], vectors[row[doc_id]]
            result = head.add(doc_id, queries if len(queries) else document[None], addition, document)
            timings.append(result.milliseconds)
            failures += not result.separable
            if n in checkpoints:
                curve.append({"added": n, **evaluation(lambda q: head.search(q, 10), order[:n])})
        return head, curve, timings, failures

    def dense_in_order(order: list[str]) -> list[dict]:
        index, curve, done = FaissStore.build(vectors[[row[d] for d in old_ids]].numpy(), old_ids), [], 0
        for n in checkpoints:
            started = time.perf_counter()
            index.add(vectors[[row[d] for d in order[done:n]]].numpy(), order[done:n])
            curve.append({"added": n, "add_ms_per_doc": 1000 * (time.perf_counter() - started) / (n - done),
                          **evaluation(lambda q: index.search(q.numpy(), 10), order[:n])})
            done = n
        return curve

    incdsi = incdsi_config(trials, incdsi_params.tune_trials, args.objective, args.beta, args.init)
    runs: dict[str, list] = {incdsi: [], "dense-add": []}
    all_timings, failures = [], 0
    for seed in range(args.orders):
        order = [new_ids[i] for i in np.random.default_rng(seed).permutation(len(new_ids))]
        head, curve, timings, failed = add_in_order(order)
        runs[incdsi].append(curve)
        all_timings.append([round(t, 3) for t in timings])
        failures += failed
        runs["dense-add"].append(dense_in_order(order))
        if seed == 0:  # the active set against the full problem: same order, every row in the optimisation
            full_head, _, full_timings, _ = add_in_order(order, active_rows=len(old_ids) + len(new_ids))
            full_rows = {**speed(full_timings), "max_row_difference": float(
                (full_head.weights - head.weights).norm(dim=1).max())}
    everything = old_ids + new_ids
    started = time.perf_counter()
    tuned, all_vectors, all_rows = head_for(everything, 0)
    # new rows from their embeddings, scaled to the trained rows' typical norm (CE grows the old rows
    # several-fold; unit-norm new rows would never win a query, whatever the epoch does)
    scale = base_head.weights.norm(dim=1).median()
    tuned.weights = torch.cat([base_head.weights, scale * tuned.weights[len(old_ids):]])
    finetune_head(tuned, all_vectors, all_rows, 1, incdsi_params.head_learning_rate)
    finetune_seconds = time.perf_counter() - started
    started = time.perf_counter()
    retrained, _, _ = head_for(everything, incdsi_params.head_epochs)
    retrain_seconds = time.perf_counter() - started
    once = {"head-finetune": ([{"added": len(new_ids), **evaluation(lambda q: tuned.search(q, 10), new_ids)}],
                              {"seconds": finetune_seconds}),
            "full-retrain": ([{"added": len(new_ids), **evaluation(lambda q: retrained.search(q, 10), new_ids)}],
                             {"seconds": retrain_seconds})}
    before = {incdsi: evaluation(lambda q: base_head.search(q, 10), []),
              "dense-add": evaluation(lambda q: FaissStore.build(vectors[[row[d] for d in old_ids]].numpy(),
                                                               old_ids).search(q.numpy(), 10), [])}
    before.update({name: before[incdsi] for name in once})

    suffix = "-zeroshot" if args.zero_shot else ""
    stamp = {"machine": machine(), "date": dt.date.today().isoformat(), "commit": commit,
             "dirty": commit.endswith("+dirty"), "params": params.model_dump(mode="json")}
    protocol = {"encoder": "base (zero-shot)" if args.zero_shot else "D0: fine-tuned on the old documents' train queries",
                "orders": args.orders, "new_share": args.new_share, "documents": {"old": len(old_ids), "new": len(new_ids)},
                "head": {"rows": len(old_ids), "dimension": int(vectors.shape[1])},
                "timings": {"d0_training_seconds": d0_seconds, "head_build_seconds": head_seconds}}
    results = {name: (curves, {}) for name, curves in runs.items()}
    results.update({name: ([curve], extra) for name, (curve, extra) in once.items()})
    finals = {name: {group: pd.concat([c[-1][group] for c in curves]).groupby(level=0).mean()  # per query, mean
                     for group in ("old", "new", "new_unseen")} for name, (curves, _) in results.items()}  # over orders
    for name, (curves, extra) in results.items():
        final = finals[name]
        old_before = scores_mean(before[name]["old"])
        metrics = {"old_mrr@10_before": old_before, "old_mrr@10_after": scores_mean(final["old"]),
                   "old_mrr@10_drop": old_before - scores_mean(final["old"]), **extra,
                   **{f"{group}_{metric}": value["mean"] for group in final
                      for metric, value in with_interval(final[group]).items()}}
        if name == incdsi:
            metrics.update(speed([t for order in all_timings for t in order]), not_separable=failures / args.orders,
                           full_rows=full_rows)
        write_json(args.out / dataset / f"{name}{suffix}.json", {
            "dataset": dataset, "config": name + suffix, "metrics": metrics,
            "intervals": {group: with_interval(final[group]) for group in final},
            "curve": [{"added": point["added"], **{f"{group}_{metric}": float(np.mean(
                [c[i][group][metric].mean() for c in curves])) for group in ("old", "new", "new_unseen")
                for metric in METRICS}} for i, point in enumerate(curves[0])],
            "protocol": protocol, "addition_params": vars(addition) if name == incdsi else None,
            "tuning_trials": tuning if name == incdsi else None,
            "per_document_ms": all_timings if name == incdsi else None,
            "paired": paired_against(finals, incdsi) if name == incdsi else None, **stamp,
        })
        with atomic_path(args.out / dataset / "per_query" / f"{name}{suffix}.csv") as tmp:
            pd.concat(final, names=["group", "query_id"]).reset_index().round(6).to_csv(tmp, index=False)
        print(f"{name + suffix:<18} old MRR@10 {metrics['old_mrr@10_after']:.4f} (drop {metrics['old_mrr@10_drop']:+.4f})"
              f"  new Hits@10 {metrics['new_hit_rate@10']:.3f} ({len(final['new'])} queries)"
              f"  unseen Hits@10 {metrics['new_unseen_hit_rate@10']:.3f} ({len(final['new_unseen'])})")
    incdsi_speed = speed([t for order in all_timings for t in order])
    print(f"IncDSI add over a {len(old_ids)}x{vectors.shape[1]} head, {args.orders} orders: mean "
          f"{incdsi_speed['add_ms_mean']:.1f} ms, median {incdsi_speed['add_ms_median']:.1f} ms, p95 "
          f"{incdsi_speed['add_ms_p95']:.1f} ms; all rows: mean {full_rows['add_ms_mean']:.1f} ms "
          f"(rows differ by at most {full_rows['max_row_difference']:.2e}); {machine()}")
    plot(results, incdsi, args.out / dataset / f"incremental{suffix}.png")
    return 0


PAIRED = [("old", "mrr@10"), ("new", "hit_rate@10"), ("new", "mrr@10"), ("new_unseen", "hit_rate@10")]


def paired_against(finals: dict[str, dict[str, pd.DataFrame]], incdsi: str) -> dict[str, dict[str, dict]]:
    """IncDSI against each other method on the same queries after every addition (each query's value
    averaged over the orders first): the difference IncDSI minus the other, its 95 % bootstrap
    interval and the paired sign-flip permutation p-value (``benchmarks.compare``), per group and
    metric of ``PAIRED`` (3 methods x 4 comparisons, no correction for their number); a group of
    fewer than two queries has no test and is left out."""
    return {other: {f"{group}_{metric}": paired_difference(finals[other][group][metric], finals[incdsi][group][metric])
                    for group, metric in PAIRED if len(finals[incdsi][group]) > 1}
            for other in finals if other != incdsi}


def scores_mean(per_query: pd.DataFrame) -> float:
    return float(per_query["mrr@10"].mean()) if len(per_query) else float("nan")


def plot(results: dict, incdsi: str, path: Path) -> None:
    figure, axes = plt.subplots(1, 2, figsize=(9, 3))
    for name in (incdsi, "dense-add"):
        curves = results[name][0]
        added = [point["added"] for point in curves[0]]
        old = [np.mean([c[i]["old"]["mrr@10"].mean() for c in curves]) for i in range(len(added))]
        new = [np.mean([c[i]["new"]["hit_rate@10"].mean() for c in curves]) for i in range(len(added))]
        axes[0].plot(added, old, marker="o", label=name)
        axes[1].plot(added, new, marker="o", label=name)
    axes[0].set(title="old documents' queries", xlabel="new documents added", ylabel="MRR@10", xscale="log")
    axes[1].set(title="new documents' queries", xlabel="new documents added", ylabel="Hits@10", xscale="log")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
