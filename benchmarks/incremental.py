"""IncDSI evaluation protocol (IncDSI Fig. 3-4, Tables 7-8 analogue) on a BEIR directory.

    python -m benchmarks.incremental --data ../shared/data/scifact [--encoder PATH]

With the ingestion stage's old/new/tune document split: a document-id head is built over the
*old* documents (rows from document embeddings, CE fine-tuning on natural train + generated
queries), then the *new* documents are added 10, 100 and all at once by

* ``incdsi``: one L-BFGS-optimised head row per document (the method under test);
* ``dense-add``: encode and ``add_with_ids`` into a FAISS index over the same embeddings;
* ``head-finetune``: rows for new documents from their embeddings (scaled to the trained rows' median
  norm), then one epoch of CE on all queries;
* ``full-retrain``: the head rebuilt and fine-tuned over old + new from scratch.

The addition hyper-parameters are first tuned as the build-head stage tunes them (optuna TPE, F5 of
old/new MRR@10 on a simulated addition of the tune documents plus held-out old documents;
``--trials``) and recorded in incdsi.json.

Scored with ranx on the test split's natural queries, grouped by the group of their relevant
documents: Hits@1, Hits@10, MRR@10 on old and on new documents' queries. The encoder is the given
one (default: zero-shot MiniLM; the protocol trains it on old documents — pass that model with
--encoder). Generated queries are the extractive fallback unless querygen.generator.model is set.
Writes benchmarks/results/<dataset>/{incdsi,dense-add,head-finetune,full-retrain}.json (``--trials 0``:
incdsi-untuned.json, with params.yaml's values) and a plot. Each file records the commit and the
resolved params; like ``benchmarks.run`` it refuses to write into ``benchmarks/results/`` from
uncommitted code unless ``--allow-dirty``.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import functools
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from benchmarks.run import PROJECT, checked_commit, machine
from model_code.config import IncDSIParams, load_params
from model_code.data.generator import generate_queries
from model_code.data.ingested import load_ingested
from model_code.eval.metrics import evaluate
from model_code.incremental.build import head_queries, tuned_addition
from model_code.incremental.head import finetune_head, train_head
from model_code.incremental.incdsi import INITS, AdditionParams
from model_code.incremental.tuning import OBJECTIVES
from model_code.index.faiss_index import DocIndex
from model_code.io import write_json
from model_code.layout import Layout
from model_code.models.encoder import Encoder
from model_code.stages import ingest

METRICS = ["hit_rate@1", "hit_rate@10", "mrr@10"]


def score(search, queries: torch.Tensor, relevant: list[str]) -> dict[str, float]:
    if not relevant:
        return {m: float("nan") for m in METRICS}
    scores, ids = search(queries)
    run = {f"q{i}": dict(zip(r, s.tolist())) for i, (r, s) in enumerate(zip(ids, scores))}
    qrels = {f"q{i}": {d: 1} for i, d in enumerate(relevant)}
    return evaluate(qrels, run, METRICS)[0]


def cached_encode(encoder: Encoder, name: str, texts: list[str], max_length: int, batch_size: int,
                  desc: str | None) -> torch.Tensor:
    """Encodings are reused across runs (``.cache/benchmarks``), keyed by model, length and texts:
    re-running the protocol after changing the addition code then takes minutes, not a quarter hour."""
    key = hashlib.sha256("\x00".join([name, str(max_length), *texts]).encode()).hexdigest()[:24]
    path = PROJECT / ".cache" / "benchmarks" / f"{key}.pt"
    if path.exists():
        return torch.load(path)
    vectors = torch.from_numpy(encoder.encode(texts, max_length, batch_size, desc=desc))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(vectors, path)
    return vectors


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
    parser.add_argument("--encoder", default="minilm")
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
    parser.add_argument("--out", type=Path, default=PROJECT / "benchmarks" / "results")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write into benchmarks/results/ from uncommitted code (the results are marked dirty)")
    args = parser.parse_args(argv)
    commit = checked_commit(parser, args.out, args.allow_dirty)
    params = load_params(PROJECT / "params.yaml", {
        "data": {"source": "beir", "path": str(args.data.resolve())},
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
    encoder = Encoder(params.encoder.model, params.encoder.pooling)
    doc_ids = data.corpus["doc_id"].tolist()
    encode = functools.partial(cached_encode, encoder, args.encoder)
    vectors = encode(data.passages(), 256, 64, "encoding corpus")
    row = {d: i for i, d in enumerate(doc_ids)}
    old_ids = [d for d in doc_ids if groups[d] == "old"]
    new_ids = [d for d in doc_ids if groups[d] == "new"]
    pairs = head_queries(data, generated, doc_ids)
    pair_vectors = encode(pairs["query"].tolist(), 64, 128, "encoding head queries")
    test = data.qrels_for("test")
    test = test[test["relevance"] > 0].drop_duplicates("query_id")
    text = dict(zip(data.queries["query_id"], data.queries["text"]))
    test_vectors = encode([text[q] for q in test["query_id"]], 64, 128, None)
    test_group = np.array([groups[d] for d in test["doc_id"]])

    def evaluation(search, added: set[str]) -> dict:
        old_mask = test_group == "old"
        new_mask = np.array([d in added for d in test["doc_id"]])
        result = {f"old_{k}": v for k, v in score(search, test_vectors[old_mask], list(test["doc_id"][old_mask])).items()}
        result.update({f"new_{k}": v for k, v in score(search, test_vectors[new_mask], list(test["doc_id"][new_mask])).items()})
        return result

    def head_for(ids: list[str], epochs: int):
        mask = pairs["doc_id"].isin(set(ids)).to_numpy()
        head, rows, _ = train_head(vectors[[row[d] for d in ids]], ids, pair_vectors[mask], pairs["doc_id"][mask].tolist(),
                                   epochs, incdsi_params.head_learning_rate)
        return head, pair_vectors[mask], rows

    def head_search(head):
        return lambda q: head.search(q, 10)

    start = time.perf_counter()
    base_head, _, _ = head_for(old_ids, incdsi_params.head_epochs)
    head_seconds = time.perf_counter() - start
    checkpoints = sorted({10, 100, len(new_ids)} & set(range(1, len(new_ids) + 1)))
    before = evaluation(head_search(base_head), set())
    tune_ids = [d for d in doc_ids if groups[d] == "tune"]
    on_tuning = pairs["doc_id"].isin(set(old_ids + tune_ids)).to_numpy()
    trials = incdsi_params.tune_trials if args.trials is None else args.trials
    chosen = tuned_addition(incdsi_params.model_copy(update={"tune_trials": trials, "tune_beta": args.beta,
                                                         "tune_objective": args.objective}),
                            vectors[[row[d] for d in old_ids]], old_ids, vectors[[row[d] for d in tune_ids]], tune_ids,
                            pairs[on_tuning].reset_index(drop=True), pair_vectors[on_tuning])
    addition, tuning = AdditionParams(**chosen["params"]), chosen.get("trials", [])
    methods: dict[str, dict] = {}

    # IncDSI: sequential additions, timed per document (optimisation only, as the paper)
    head, curve, timings, failures = copy.deepcopy(base_head), [], [], 0
    for n, doc_id in enumerate(new_ids, start=1):
        q = pair_vectors[torch.from_numpy((pairs["doc_id"] == doc_id).to_numpy())]
        document = vectors[row[doc_id]]
        result = head.add(doc_id, q if len(q) else document[None], addition, document)
        timings.append(result.milliseconds)
        failures += not result.separable
        if n in checkpoints:
            curve.append({"added": n, **evaluation(head_search(head), set(new_ids[:n]))})
    incdsi = incdsi_config(trials, incdsi_params.tune_trials, args.objective, args.beta, args.init)
    methods[incdsi] = {"curve": curve, "add_ms_median": statistics.median(timings),
                         "add_ms_p95": float(np.percentile(timings, 95)), "not_separable": failures}

    # dense encode-and-add over the same embeddings
    index, curve, start_n = DocIndex.build(vectors[[row[d] for d in old_ids]].numpy(), old_ids), [], 0
    dense_before = evaluation(lambda q: index.search(q.numpy(), 10), set())
    for n in checkpoints:
        t0 = time.perf_counter()
        batch = new_ids[start_n:n]
        index.add(vectors[[row[d] for d in batch]].numpy(), batch)
        curve.append({"added": n, "add_ms_per_doc": 1000 * (time.perf_counter() - t0) / len(batch),
                      **evaluation(lambda q: index.search(q.numpy(), 10), set(new_ids[:n]))})
        start_n = n
    methods["dense-add"] = {"curve": curve, "before": dense_before}

    # continued fine-tuning of the head for one epoch, and a full retrain, with all new documents
    everything = old_ids + new_ids
    t0 = time.perf_counter()
    tuned, all_vectors, all_rows = head_for(everything, 0)
    # new rows from their embeddings, scaled to the trained rows' typical norm (CE grows the old rows
    # several-fold; unit-norm new rows would never win a query, whatever the epoch does)
    scale = base_head.weights.norm(dim=1).median()
    tuned.weights = torch.cat([base_head.weights, scale * tuned.weights[len(old_ids):]])
    finetune_head(tuned, all_vectors, all_rows, 1, incdsi_params.head_learning_rate)
    methods["head-finetune"] = {"curve": [{"added": len(new_ids), "seconds": time.perf_counter() - t0,
                                           **evaluation(head_search(tuned), set(new_ids))}]}
    t0 = time.perf_counter()
    retrained, _, _ = head_for(everything, incdsi_params.head_epochs)
    methods["full-retrain"] = {"curve": [{"added": len(new_ids), "seconds": time.perf_counter() - t0,
                                          **evaluation(head_search(retrained), set(new_ids))}]}

    stamp = {"machine": machine(), "date": dt.date.today().isoformat(), "commit": commit,
             "dirty": commit.endswith("+dirty"), "params": params.model_dump(mode="json")}
    for name, result in methods.items():
        final, start_point = result["curve"][-1], result.pop("before", before)
        metrics = {"old_mrr@10_before": start_point["old_mrr@10"], "old_mrr@10_after": final["old_mrr@10"],
                   "old_mrr@10_drop": start_point["old_mrr@10"] - final["old_mrr@10"],
                   "new_hits@1": final["new_hit_rate@1"], "new_hits@10": final["new_hit_rate@10"],
                   "new_mrr@10": final["new_mrr@10"], "old_hits@1": final["old_hit_rate@1"],
                   "old_hits@10": final["old_hit_rate@10"]}
        metrics.update({k: v for k, v in result.items() if k not in {"curve"}})
        write_json(args.out / dataset / f"{name}.json", {
            "dataset": dataset, "config": name, "metrics": metrics, "curve": result["curve"],
            "timings": {"head_build_seconds": head_seconds}, "documents": {"old": len(old_ids), "new": len(new_ids)},
            "encoder": args.encoder, "addition_params": vars(addition) if name == incdsi else None,
            "tuning_trials": tuning if name == incdsi else None, **stamp,
        })
        print(f"{name:<14} old MRR@10 {metrics['old_mrr@10_after']:.4f} (drop {metrics['old_mrr@10_drop']:+.4f})  "
              f"new Hits@1 {metrics['new_hits@1']:.3f} Hits@10 {metrics['new_hits@10']:.3f}")
    print(f"IncDSI add: median {methods[incdsi]['add_ms_median']:.1f} ms, p95 {methods[incdsi]['add_ms_p95']:.1f} ms "
          f"per document over a {len(old_ids)}-row head; {failures} not separable")
    figure, axes = plt.subplots(1, 2, figsize=(9, 3))
    for name in (incdsi, "dense-add"):
        curve = methods[name]["curve"]
        axes[0].plot([c["added"] for c in curve], [c["old_mrr@10"] for c in curve], marker="o", label=name)
        axes[1].plot([c["added"] for c in curve], [c["new_hit_rate@10"] for c in curve], marker="o", label=name)
    axes[0].set(title="old documents' queries", xlabel="new documents added", ylabel="MRR@10", xscale="log")
    axes[1].set(title="new documents' queries", xlabel="new documents added", ylabel="Hits@10", xscale="log")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(args.out / dataset / "incremental.png", dpi=100)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
