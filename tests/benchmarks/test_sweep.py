"""The sweep tool selects on dev only and compares the winner with a baseline on test.

The dataset is built so that dev and test disagree: dev queries match their document only through
stemming (query "running", document "runs runs"), test queries are hurt by it (query
"experiment": stemmed, the distractors' "experience experience experience" outscores the
document's single "experiment"). A sweep that looked at test would pick ``stemmer: null``; one
that selects on dev picks ``english``.
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import run as benchmark_run
from benchmarks import sweep
from benchmarks.configs import resolve_params
from model_code.data import beir as beir_reader
from model_code.io import tree_sha256
from model_code.layout import Layout
from model_code.stages import evaluate, index, ingest

FILLER = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
          "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
          "xray", "yankee", "zulu"]
DEV = [("running", "runs"), ("galaxies", "galaxy"), ("cooked", "cooking"), ("painted", "painting")]
TEST = [("experiment", "experience"), ("animal", "animation"), ("operation", "operate")]
GRID = ["--grid", "retriever.bm25.k1=[1.2, 2.0]", "--grid", "retriever.bm25.stemmer=[null, english]"]


def write_dataset(directory: Path) -> Path:
    corpus, queries, qrels = [], [], {"train": [], "dev": [], "test": []}
    fill = iter(range(10_000))

    def filler(n):
        return " ".join(FILLER[next(fill) % len(FILLER)] for _ in range(n))

    def add(doc_id, text):
        corpus.append({"_id": doc_id, "title": "", "text": text})

    for split, pairs, relevant_text, distractor_text in (
        ("dev", DEV, lambda q, other: f"{other} {other} {filler(6)}", lambda q, other: f"{q} {filler(7)}"),
        ("test", TEST, lambda q, other: f"{q} {filler(7)}", lambda q, other: f"{other} {other} {other} {filler(5)}"),
    ):
        for i, (word, other) in enumerate(pairs):
            add(f"{split}-rel-{i}", relevant_text(word, other))
            for j in range(2):
                add(f"{split}-distractor-{i}-{j}", distractor_text(word, other))
            queries.append({"_id": f"{split}-q{i}", "text": word})
            qrels[split].append(f"{split}-q{i}\t{split}-rel-{i}\t1")
    for i in range(12):  # train queries, not used by BM25, so that the dataset has all three splits
        add(f"train-{i}", filler(8))
        queries.append({"_id": f"train-q{i}", "text": FILLER[(3 * i) % len(FILLER)]})
        qrels["train"].append(f"train-q{i}\ttrain-{i}\t1")
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (directory / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    for split, rows in qrels.items():
        (directory / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return directory


def scorer(data: Path, workdir: Path):
    """nDCG@10 of one BM25 setting on a split, scored here on its own (not through the sweep):
    the data ingested once, then the index and evaluate stages per setting."""
    layout = Layout(workdir)
    ingest.run(resolve_params({"retriever": {"kind": "bm25"}}, data), layout)

    def score(split: str, **bm25) -> float:
        params = resolve_params({"retriever": {"kind": "bm25", "bm25": bm25}, "eval": {"split": split}}, data)
        index.run(params, layout)
        return evaluate.run(params, layout)["ndcg@10"]

    return score


def test_the_sweep_picks_the_dev_winner_without_reading_test_and_compares_it_on_test(tmp_path, monkeypatch):
    data = write_dataset(tmp_path / "stems")
    results = tmp_path / "results"

    # what each variant scores, measured here one by one
    score = scorer(data, tmp_path / "independent")
    dev = {(k1, stemmer): score("dev", k1=k1, stemmer=stemmer)
           for k1 in (1.2, 2.0) for stemmer in (None, "english")}
    assert min(dev[k, "english"] for k in (1.2, 2.0)) > max(dev[k, None] for k in (1.2, 2.0))
    best = max(dev.values())
    expected = next(key for key, value in dev.items() if value == best)  # the first best in grid order
    test_winner = score("test", k1=expected[0], stemmer=expected[1])
    test_baseline = score("test", stemmer=None)  # bm25's k1, --set's stemmer
    assert score("test", k1=expected[0], stemmer=None) > test_winner  # test would pick null

    # selection must never read the test qrels: the reader fails on them until selection is over
    reads, selecting = [], [False]
    real_reader, real_select = beir_reader._read_qrels_tsv, sweep.select

    def reader(path):
        reads.append((selecting[0], Path(path).name))
        if selecting[0] and Path(path).name == "test.tsv":
            raise AssertionError(f"selection read the test qrels: {path}")
        return real_reader(path)

    def select(*args, **kwargs):
        selecting[0] = True
        try:
            return real_select(*args, **kwargs)
        finally:
            selecting[0] = False

    monkeypatch.setattr(beir_reader, "_read_qrels_tsv", reader)
    monkeypatch.setattr(sweep, "select", select)
    assert sweep.main(["--data", str(data), "--name", "stems", "--base", "bm25", "--baseline", "bm25", *GRID,
                       "--set", "retriever.bm25.stemmer=null", "--seeds", "2", "--out", str(results)]) == 0
    assert (True, "dev.tsv") in reads and (True, "test.tsv") not in reads  # the reader did serve selection
    assert (False, "test.tsv") in reads  # and the test runs afterwards

    row = json.loads((results / "stems" / "sweeps" / "stems.json").read_text())
    assert row["winner"]["params"] == {"retriever.bm25.k1": expected[0], "retriever.bm25.stemmer": expected[1]}
    assert row["winner"]["params"]["retriever.bm25.stemmer"] == "english"
    assert row["winner"]["dev"] == pytest.approx(best)
    assert [v["dev"]["ndcg@10"] for v in row["variants"]] == pytest.approx(list(dev.values()))
    assert row["variants_tried"] == 4 and row["selection"]["split"] == "dev"

    # the comparison: winner (stemmed) against the baseline with --set's stemmer: null, over two seeds
    c = row["comparison"]
    assert row["seeds"] == [0, 1] and [r["seed"] for r in row["test"]["baseline"]] == [0, 1]
    assert c["other"] == pytest.approx(test_winner) and c["baseline"] == pytest.approx(test_baseline)
    assert c["difference"] == pytest.approx(test_winner - test_baseline) and c["difference"] < 0
    assert {"ci95", "p_value", "better", "same", "worse"} <= set(c) and c["queries"] == len(TEST)
    assert c["ci95"][0] <= c["difference"] <= c["ci95"][1] and 0 < c["p_value"] <= 1
    assert row["params"]["winner"]["retriever"]["bm25"]["stemmer"] == "english"
    assert row["params"]["baseline"]["retriever"]["bm25"]["stemmer"] is None
    assert row["dataset_sha256"] == tree_sha256(data) and row["commit"]
    per_query = pd.read_csv(results / "stems" / "sweeps" / "stems" / "winner-seed1.csv", dtype={"query_id": str})
    assert sorted(per_query["query_id"]) == ["test-q0", "test-q1", "test-q2"]
    table = (results.parent / "RESULTS.md").read_text()
    assert ("| stems | stems | bm25 | 4 | retriever.bm25.k1=1.2, retriever.bm25.stemmer=english | "
            "retriever.bm25.stemmer=None | ndcg@10 ") in table


def test_a_grid_must_be_a_list_and_keys_must_exist(tmp_path):
    data = write_dataset(tmp_path / "stems")
    common = ["--data", str(data), "--name", "x", "--base", "bm25", "--baseline", "bm25", "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit):
        sweep.main([*common, "--grid", "retriever.bm25.k1=1.2"])  # not a list
    with pytest.raises(SystemExit):
        sweep.main([*common, "--grid", "retriever.bm25.kone=[1.2]"])  # no such key: refused before running
    assert not (tmp_path / "r").exists()


def test_a_measured_baseline_is_reused_only_when_it_measured_the_same_thing(tmp_path, monkeypatch):
    data = write_dataset(tmp_path / "stems")
    results = tmp_path / "results"
    monkeypatch.setattr(benchmark_run, "code_version", lambda results=None: "abc1234")
    assert benchmark_run.main(["--data", str(data), "--config", "bm25", "--out", str(results)]) == 0
    params = resolve_params(sweep.overrides("bm25", {}, {}), data).model_dump(mode="json")
    sha = tree_sha256(data)
    monkeypatch.setattr(sweep, "changed_dependencies", lambda commit, harness, params: [])
    found = sweep.measured(results, "stems", "bm25", 0, params, sha, "abc1234")
    assert found is not None and found[0] == "bm25.json" and len(found[1]) == len(TEST)
    other = resolve_params(sweep.overrides("bm25", {"retriever.bm25.k1": 2.0}, {}), data).model_dump(mode="json")
    assert sweep.measured(results, "stems", "bm25", 0, other, sha, "abc1234") is None  # other params
    assert sweep.measured(results, "stems", "bm25", 0, params, "0" * 64, "abc1234") is None  # other data
    assert sweep.measured(results, "stems", "bm25", 0, params, sha, "abc1234+dirty") is None  # uncommitted code now
    assert sweep.measured(results, "stems", "bm25", 1, params, sha, "abc1234") is None  # seed 1 never measured
    monkeypatch.setattr(sweep, "accelerator", lambda: "NVIDIA H200")
    assert sweep.measured(results, "stems", "bm25", 0, params, sha, "abc1234") is None  # measured on the CPU
    monkeypatch.setattr(sweep, "accelerator", benchmark_run.accelerator)
    monkeypatch.setattr(sweep, "changed_dependencies", lambda commit, harness, params: ["model_code/io.py"])
    assert sweep.measured(results, "stems", "bm25", 0, params, sha, "abc1234") is None  # code changed since


# a convenience of the benchmark tool, not of the pipeline, and about 25 CPU-seconds of a 2-core CI run: slow tier
@pytest.mark.slow
def test_a_stopped_sweep_resumes_without_running_again_what_it_finished(tmp_path, monkeypatch):
    """Killed during its fourth run, the sweep started again runs only the five left (4 dev variants
    + 2 seeds of winner and baseline = 8); started a third time it runs nothing and gives the same
    comparison; at another commit nothing is reused."""
    data = write_dataset(tmp_path / "stems")
    results = tmp_path / "results"
    commit = ["abc1234"]
    monkeypatch.setattr(sweep, "checked_commit", lambda parser, out, allow_dirty: commit[0])
    real_run, ran = sweep.run_params, []

    def counted(params, workdir):
        if len(ran) == stop_at[0]:
            raise KeyboardInterrupt  # the process is stopped in the middle of this run
        ran.append((params.eval.split, params.retriever.bm25.k1, params.retriever.bm25.stemmer))
        return real_run(params, workdir)

    stop_at = [3]
    monkeypatch.setattr(sweep, "run_params", counted)
    argv = ["--data", str(data), "--name", "resume", "--base", "bm25", "--baseline", "bm25", *GRID,
            "--set", "retriever.bm25.stemmer=null", "--seeds", "2", "--out", str(results)]
    with pytest.raises(KeyboardInterrupt):
        sweep.main(argv)
    row_file = results / "stems" / "sweeps" / "resume.json"
    assert not row_file.exists() and len(ran) == 3
    stop_at[0] = None
    assert sweep.main(argv) == 0
    assert len(ran) == 8 and ran[3][0] == "dev" and [r[0] for r in ran[4:]] == ["test"] * 4
    first = json.loads(row_file.read_text())
    assert first["variants_tried"] == 4 and first["winner"]["params"]["retriever.bm25.stemmer"] == "english"

    # the seconds of every run, the three of the first sitting included
    seconds = [v["seconds"] for v in first["variants"]] + [r["seconds"] for side in ("winner", "baseline")
                                                           for r in first["test"][side]]
    assert len(seconds) == 8 and all(s > 0 for s in seconds)
    assert first["timings"]["total"] == pytest.approx(sum(seconds), abs=0.15)

    assert sweep.main(argv) == 0
    assert len(ran) == 8  # everything was finished: nothing ran
    again = json.loads(row_file.read_text())
    assert again["comparison"] == first["comparison"] and again["variants"] == first["variants"]
    assert again["timings"]["total"] == first["timings"]["total"]  # the runs' time, not this sitting's

    monkeypatch.setattr(sweep, "accelerator", lambda: "NVIDIA H200")  # same code, another accelerator
    assert sweep.main(argv) == 0
    assert len(ran) == 16
    monkeypatch.setattr(sweep, "accelerator", benchmark_run.accelerator)

    commit[0] = "def5678"  # other code: its runs are not these
    assert sweep.main(argv) == 0
    assert len(ran) == 24


def test_a_dev_winner_with_the_baselines_params_runs_its_test_seeds_once(tmp_path, monkeypatch):
    """bm25's own stemmer is english, which dev picks: winner and baseline are one configuration, so
    the two test seeds run once (2 dev + 2 test runs, not 2 + 4) and the comparison is zero."""
    data = write_dataset(tmp_path / "stems")
    results = tmp_path / "results"
    real_run, ran = sweep.run_params, []

    def counted(params, workdir):
        ran.append((params.eval.split, params.retriever.bm25.stemmer))
        return real_run(params, workdir)

    monkeypatch.setattr(sweep, "run_params", counted)
    assert sweep.main(["--data", str(data), "--name", "same", "--base", "bm25", "--baseline", "bm25",
                       "--grid", "retriever.bm25.stemmer=[null, english]", "--seeds", "2", "--out", str(results)]) == 0
    assert ran == [("dev", None), ("dev", "english"), ("test", "english"), ("test", "english")]
    row = json.loads((results / "stems" / "sweeps" / "same.json").read_text())
    assert row["winner"]["params"] == {"retriever.bm25.stemmer": "english"}
    assert [r["source"] for r in row["test"]["baseline"]] == ["the winner's run (the same params)"] * 2
    assert row["comparison"]["difference"] == 0 and row["comparison"]["same"] == len(TEST)
    assert row["timings"]["test"] == pytest.approx(sum(r["seconds"] for r in row["test"]["winner"]), abs=0.1)
    for seed in (0, 1):  # the baseline's per-query files are there like any baseline's
        files = [results / "stems" / "sweeps" / "same" / f"{side}-seed{seed}.csv" for side in ("winner", "baseline")]
        assert files[0].read_text() == files[1].read_text()
