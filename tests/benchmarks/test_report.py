"""Benchmark reporting: the branching sweep is read back from results files and plotted, the
results table lists every kind of result, and runs are compared query by query (trained runs
themselves are too long for CI; the BM25 run is fast enough to exercise the runner)."""

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from benchmarks import branching, compare, provenance
from benchmarks import run as benchmark_run
from benchmarks.configs import BRANCHING_SWEEP, PARAMS_FILE, PIPELINE_CONFIGS, resolve_params
from benchmarks.report import archive_reasons, write_results_table
from benchmarks.run import code_version, loss_parts
from model_code.config import Params, load_params


def result(config, ndcg, seconds=60.0):
    return {"dataset": "toy", "config": config, "metrics": {"ndcg@10": ndcg, "recall@100": 0.9, "mrr@10": 0.5},
            "timings": {"total": seconds}, "training": {"examples_per_second": 12.5}, "peak_rss_mb": 100.0,
            "machine": "test machine", "date": "2026-01-01"}


def tabled(tmp_path, result: dict, header_start: str, row_marker: str) -> dict[str, str]:
    """Write ``result`` as the one results file of dataset toy, generate RESULTS.md, and return the
    cells of the row containing ``row_marker`` under the header starting with ``header_start``."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / f"{result['config']}.json").write_text(json.dumps(result))
    write_results_table(tmp_path, tmp_path / "RESULTS.md")
    lines = (tmp_path / "RESULTS.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith(header_start))
    row = next(line for line in lines if row_marker in line)
    return dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))


def test_every_sweep_point_is_hce_j_no_cotrain_with_its_branching_factor():
    for b in BRANCHING_SWEEP:
        config = PIPELINE_CONFIGS[f"hce-j-b{b}"]
        assert config["hierarchy"] == {"branching": b}
        assert config["train"] == PIPELINE_CONFIGS["hce-j-no-cotrain"]["train"]


def test_branching_sweep_plots_the_measured_points(tmp_path):
    results = tmp_path / "results" / "toy"
    results.mkdir(parents=True)
    for b, ndcg in [(4, 0.61), (16, 0.65)]:
        measured = {**result(f"hce-j-b{b}", ndcg), "commit": f"c{b}", "params": {"hierarchy": {"branching": b}}}
        (results / f"hce-j-b{b}.json").write_text(json.dumps(measured))
    data = tmp_path / "toy"
    assert branching.main(["--data", str(data), "--out", str(tmp_path / "results"), "--only-plot"]) == 0
    gathered = json.loads((results / "branching.json").read_text())
    rows = gathered["rows"]
    assert [(r["branching"], r["ndcg@10"], r["commit"]) for r in rows] == [(4, 0.61, "c4"), (16, 0.65, "c16")]
    assert gathered["params"] == {"4": {"hierarchy": {"branching": 4}}, "16": {"hierarchy": {"branching": 16}}}
    assert gathered["commit"].removesuffix("+dirty") == code_version().removesuffix("+dirty")
    assert (results / "branching.png").stat().st_size > 0


def test_the_auto_branching_point_is_read_from_hce_j_no_cotrain(tmp_path):
    data = tmp_path / "toy"
    data.mkdir()
    (data / "corpus.jsonl").write_text("".join(f'{{"_id": "d{i}", "text": "t"}}\n' for i in range(50)))
    assert branching.auto_point(data) == 4  # 4**3 >= 50 > 2**3
    results = tmp_path / "results" / "toy"
    results.mkdir(parents=True)
    (results / "hce-j-no-cotrain.json").write_text(json.dumps(result("hce-j-no-cotrain", 0.62)))
    (results / "hce-j-b16.json").write_text(json.dumps(result("hce-j-b16", 0.65)))
    assert branching.main(["--data", str(data), "--out", str(tmp_path / "results"), "--only-plot"]) == 0
    rows = json.loads((results / "branching.json").read_text())["rows"]
    assert [(r["branching"], r["config"], r["ndcg@10"]) for r in rows] == [(4, "hce-j-no-cotrain", 0.62),
                                                                             (16, "hce-j-b16", 0.65)]


def test_results_table_shows_training_throughput(tmp_path):
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "hce-j.json").write_text(json.dumps(result("hce-j", 0.7)))
    write_results_table(tmp_path, tmp_path / "RESULTS.md")
    row = next(line for line in (tmp_path / "RESULTS.md").read_text().splitlines() if "| hce-j |" in line)
    assert "| 0.7000 |" in row and "| 12.5 |" in row


def test_a_row_measured_on_another_split_than_test_says_so(tmp_path):
    """The quality table is of test metrics: a run whose params evaluated dev would pass for one."""
    on_dev = {**result("ct", 0.8), "params": {"eval": {"split": "dev"}}}
    cells = tabled(tmp_path, on_dev, "| dataset |", "| toy |")
    assert "(**dev split**, not test)" in cells["config"]
    (tmp_path / "t").mkdir()
    assert "split" not in tabled(tmp_path / "t", {**result("ct", 0.8), "params": {"eval": {"split": "test"}}},
                                 "| dataset |", "| toy |")["config"]


def test_incremental_table_shows_the_papers_mean_time_and_the_unseen_queries(tmp_path):
    """The IncDSI paper reports the mean addition time (total / documents) and unseen-query hits:
    both are columns of the incremental table, beside the median, each under its own header."""
    metrics = {"old_mrr@10_before": 0.8, "old_mrr@10_after": 0.75, "old_mrr@10_drop": 0.05, "new_hit_rate@1": 0.25,
               "new_hit_rate@10": 0.5, "new_mrr@10": 0.3, "new_unseen_hit_rate@10": 0.875, "add_ms_mean": 34.0,
               "add_ms_median": 31.0, "add_ms_p95": 60.0, "not_separable": 0.0}
    cells = tabled(tmp_path, {"dataset": "toy", "config": "incdsi", "metrics": metrics, "machine": "test machine",
                              "date": "2026-01-01"}, "| dataset | config | old MRR@10 before", "| incdsi |")
    assert (cells["unseen Hits@10"], cells["add ms mean"], cells["median"], cells["p95"]) == (
        "0.8750", "34.0000", "31.0000", "60.0000")


def test_incdsis_paired_comparisons_are_tabled_as_incdsi_minus_the_other(tmp_path):
    """From compare.paired_difference's output with the other method as baseline: IncDSI's column
    holds its own value and the difference keeps its sign (IncDSI above: positive)."""
    comparison = compare.paired_difference(pd.Series([0.0, 1.0], index=["a", "b"]), pd.Series([1.0, 1.0], index=["a", "b"]))
    cells = tabled(tmp_path, {"dataset": "toy", "config": "incdsi", "metrics": {"old_mrr@10_drop": 0.0},
                              "machine": "test machine", "date": "2026-01-01",
                              "paired": {"dense-add": {"new_hit_rate@10": comparison}}},
                   "| dataset | config | against", "| dense-add |")
    assert (cells["measure"], cells["IncDSI"], cells["other"], cells["difference"]) == (
        "new_hit_rate@10", "1.0000", "0.5000", "+0.5000")
    assert cells["better / same / worse"] == "1 / 1 / 0"


def test_svdr_index_rows_are_tabled_with_their_load_and_provenance(tmp_path):
    """An svdr_index row gets its own table, judged by what benchmarks.svdr_index imports: at this
    checkout's own commit nothing has changed since, so it is current (a harness missing from
    provenance's list would raise instead)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=provenance.PROJECT, capture_output=True,
                          text=True, check=True).stdout.strip()
    metrics = {"binary_docs_per_s_at_256": 1500.0, "dense_docs_per_s_at_256": 15.0, "build_speedup_vs_dense": 100.0,
               "query_ms_beta_rerank10": 400.0}
    cells = tabled(tmp_path, {"dataset": "toy", "config": "svdr-index", "metrics": metrics,
                              "load_average": {"start": 1.5, "end": 2.0}, "machine": "test machine",
                              "date": "2026-01-01", "commit": head, "params": {}},
                   "| dataset | binary docs/s at 256", "| toy |")
    assert (cells["build speedup at 256"], cells["beta_rerank10"], cells["at 64"], cells["load average"]) == (
        "100.0000", "400.0000", "—", "1.5 → 2.0")
    assert cells["provenance"] == f"current ({head})"


def test_seed_reruns_are_summarised_with_their_base_configuration(tmp_path):
    (tmp_path / "toy").mkdir()
    for config, ndcg in [("hce-j-long", 0.69), ("hce-j-long-seed1", 0.70), ("hce-j-long-seed2", 0.71), ("ct", 0.6)]:
        (tmp_path / "toy" / f"{config}.json").write_text(json.dumps(result(config, ndcg)))
    write_results_table(tmp_path, tmp_path / "RESULTS.md")
    text = (tmp_path / "RESULTS.md").read_text()
    section = text[text.index("## Run-to-run variance"):]
    assert "| toy | hce-j-long | 3 | 0.7000 | 0.0100 | 0.6900 | 0.7100 | 0.9000 |" in section
    assert "| ct |" not in section  # one run: nothing to summarise


def test_results_name_the_commit_they_measured():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert code_version().removesuffix("+dirty") == head


def test_only_code_changes_mark_a_result_dirty(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "a.json").write_text("{}")
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("# results")
    (tmp_path / "code.py").write_text("x = 1")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "start")
    (tmp_path / "benchmarks" / "results" / "a.json").write_text('{"ndcg@10": 0.7}')
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("# results, regenerated")
    assert not code_version(tmp_path).endswith("+dirty")
    (tmp_path / "mine" / "results").mkdir(parents=True)  # a run's --out somewhere else in the checkout
    (tmp_path / "mine" / "RESULTS.md").write_text("# mine")
    git("add", "mine")
    git("commit", "-qm", "own results")
    (tmp_path / "mine" / "RESULTS.md").write_text("# mine, regenerated")
    assert not code_version(tmp_path, results=tmp_path / "mine" / "results").endswith("+dirty")
    assert code_version(tmp_path).endswith("+dirty")  # not a results location of this run
    (tmp_path / "mine" / "RESULTS.md").write_text("# mine")
    (tmp_path / "code.py").write_text("x = 2")
    assert code_version(tmp_path).endswith("+dirty")


def test_loss_parts_summarise_the_first_and_last_steps_of_each_term():
    steps = pd.DataFrame({"step": range(1, 31), "loss": range(30, 0, -1), "lr": 1e-5,
                          "supervised.level_1": [2.0] * 10 + [9.0] * 10 + [1.0] * 10})
    assert loss_parts(steps) == {"loss": [25.5, 5.5], "supervised.level_1": [2.0, 1.0]}


def test_a_run_keeps_each_test_query_and_compares_query_by_query(tmp_path, beir_dir):
    results = tmp_path / "results"
    assert benchmark_run.main(["--data", str(beir_dir), "--config", "bm25", "--out", str(results)]) == 0
    per_query = pd.read_csv(results / "beir" / "per_query" / "bm25.csv", dtype={"query_id": str})
    assert len(per_query) == 12 and set(benchmark_run.METRICS) <= set(per_query.columns)
    saved = json.loads((results / "beir" / "bm25.json").read_text())["metrics"]["ndcg@10"]
    assert per_query["ndcg@10"].mean() == pytest.approx(saved, abs=1e-6)

    assert compare.main(["--dataset", "beir", "--results", str(results), "bm25", "bm25"]) == 0
    written = json.loads((results / "beir" / "comparisons" / "bm25.ndcg@10.json").read_text())
    same = written["comparisons"]["bm25"]
    assert written["sources"] == {"bm25": json.loads((results / "beir" / "bm25.json").read_text())["commit"]}
    assert same["difference"] == 0 and same["p_value"] == 1 and same["same"] == 12
    with pytest.raises(SystemExit):  # a configuration never measured: a clear usage error, not a traceback
        compare.main(["--dataset", "beir", "--results", str(results), "bm25", "ct-long"])


def test_seed_reruns_are_averaged_query_by_query_and_unknown_metrics_are_usage_errors(tmp_path):
    (tmp_path / "toy" / "per_query").mkdir(parents=True)
    for config, scores in [("a", [0.2, 0.4, 0.6]), ("a-seed1", [0.4, 0.4, 0.8]), ("b", [0.3, 0.5, 0.7])]:
        pd.DataFrame({"query_id": ["1", "2", "3"], "ndcg@10": scores}).to_csv(
            tmp_path / "toy" / "per_query" / f"{config}.csv", index=False)
    averaged = compare.load_metric(tmp_path, "toy", "a+a-seed1", "ndcg@10")
    assert averaged.tolist() == pytest.approx([0.3, 0.4, 0.7])
    assert compare.main(["--dataset", "toy", "--results", str(tmp_path), "a+a-seed1", "b"]) == 0
    row = json.loads((tmp_path / "toy" / "comparisons" / "a+a-seed1.ndcg@10.json").read_text())["comparisons"]["b"]
    assert row["difference"] == pytest.approx(0.1 / 3) and (row["better"], row["same"], row["worse"]) == (1, 1, 1)
    with pytest.raises(SystemExit):  # a metric the runs did not record: a usage error naming what they did
        compare.main(["--dataset", "toy", "--results", str(tmp_path), "--metric", "map@10", "a", "b"])


def test_a_sweeps_test_runs_compare_with_rows_and_name_the_sweeps_commit(tmp_path):
    """sweeps/<sweep>/<run>: the sweep's per-query file, its commit from the sweep's file."""
    (tmp_path / "toy" / "per_query").mkdir(parents=True)
    (tmp_path / "toy" / "sweeps" / "s").mkdir(parents=True)
    pd.DataFrame({"query_id": ["1", "2"], "ndcg@10": [0.5, 0.5]}).to_csv(tmp_path / "toy" / "per_query" / "b.csv",
                                                                        index=False)
    for run, scores in [("winner-seed0", [0.6, 0.5]), ("winner-seed1", [0.8, 0.5])]:
        pd.DataFrame({"query_id": ["1", "2"], "ndcg@10": scores}).to_csv(tmp_path / "toy" / "sweeps" / "s" / f"{run}.csv",
                                                                        index=False)
    (tmp_path / "toy" / "sweeps" / "s.json").write_text(json.dumps({"commit": "abc1234"}))
    (tmp_path / "toy" / "b.json").write_text(json.dumps({"commit": "def5678"}))
    runs = "sweeps/s/winner-seed0+sweeps/s/winner-seed1"
    assert compare.main(["--dataset", "toy", "--results", str(tmp_path), "b", runs]) == 0
    written = json.loads((tmp_path / "toy" / "comparisons" / "b.ndcg@10.json").read_text())
    assert written["comparisons"][runs]["difference"] == pytest.approx(0.1)  # (0.7 - 0.5 + 0) / 2
    assert written["sources"] == {"b": "def5678", "sweeps/s/winner-seed0": "abc1234", "sweeps/s/winner-seed1": "abc1234"}
    assert compare.main(["--dataset", "toy", "--results", str(tmp_path), "sweeps/s/winner-seed0", "b"]) == 0
    assert (tmp_path / "toy" / "comparisons" / "sweeps.s.winner-seed0.ndcg@10.json").exists()
    with pytest.raises(SystemExit):  # a sweep run that is not there: a usage error
        compare.main(["--dataset", "toy", "--results", str(tmp_path), "b", "sweeps/s/baseline-seed0"])


def test_a_consistent_gain_is_significant_and_noise_is_not():
    queries = [f"q{i}" for i in range(200)]
    base = pd.Series(np.random.default_rng(0).uniform(0.2, 0.8, 200), index=queries)
    gain = compare.paired_difference(base, base + 0.05)
    assert gain["difference"] == pytest.approx(0.05) and gain["p_value"] < 0.01 and gain["better"] == 200
    assert gain["ci95"][0] == pytest.approx(0.05) and gain["ci95"][1] == pytest.approx(0.05)
    noise = base + np.random.default_rng(1).choice([-0.05, 0.05], 200)
    assert compare.paired_difference(base, noise)["p_value"] > 0.05
    with pytest.raises(ValueError, match="different queries"):
        compare.paired_difference(base, base.iloc[:100])
    same_gain = compare.paired_difference(pd.Series([0.5, 0.5, 1.0]), pd.Series([0.0, 0.0, 0.5]))
    assert same_gain["ci95"] == [-0.5, -0.5]  # every query moved alike: a point interval, not NaN


def test_published_results_name_their_params_data_and_clean_commit(tmp_path, beir_dir, monkeypatch):
    """A results row carries what reproduces it; uncommitted code cannot write into
    benchmarks/results/ unless the row says so."""
    from model_code.io import tree_sha256

    monkeypatch.setattr(benchmark_run, "code_version", lambda results=None: "abc1234+dirty")
    published = benchmark_run.PROJECT / "benchmarks" / "results"
    with pytest.raises(SystemExit):  # refused before anything runs or is written
        benchmark_run.main(["--data", str(beir_dir), "--config", "bm25", "--out", str(published)])
    assert not (published / "beir").exists()

    results = tmp_path / "results"  # elsewhere: written, and marked
    assert benchmark_run.main(["--data", str(beir_dir), "--config", "bm25", "--out", str(results)]) == 0
    row = json.loads((results / "beir" / "bm25.json").read_text())
    assert (row["commit"], row["dirty"]) == ("abc1234+dirty", True)
    assert row["params"]["retriever"]["kind"] == "bm25" and row["params"]["data"]["path"] == str(beir_dir.resolve())
    assert row["dataset_sha256"] == tree_sha256(beir_dir)


def test_rows_are_stale_when_a_file_their_run_imports_changed_since_their_commit(tmp_path):
    """Provenance in a throwaway repository: a change to a module the harness reaches (even through
    an import inside a function) makes a row stale, a change elsewhere does not; a row without params
    depends on its own configuration's files (its base's too), not on the others'; rows without a
    commit, from uncommitted code or from an unknown commit say so; the table is deterministic."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    files = {
        "benchmarks/__init__.py": "",
        "benchmarks/run.py": "from benchmarks import configs\nfrom model_code import a\n",
        "benchmarks/configs.py": "X = 1\n",
        "benchmarks/configs/_base.yaml": "encoder: {max_query_length: 64}\n",
        "benchmarks/configs/bm25.yaml": "base: _base\nretriever: {kind: bm25}\n",
        "benchmarks/configs/other.yaml": "retriever: {kind: dense}\n",
        "model_code/__init__.py": "",
        "model_code/a.py": "from . import b\n",
        "model_code/b.py": "def lazy():\n    import model_code.c\n",
        "model_code/c.py": "C = 1\n",
        "model_code/unrelated.py": "U = 1\n",
        "params.yaml": "a: 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "start")
    first = git("rev-parse", "--short", "HEAD")
    assert provenance.module_closure(["benchmarks.run"], tmp_path) == [
        "benchmarks/__init__.py", "benchmarks/run.py", "model_code/__init__.py", "model_code/a.py",
        "model_code/b.py", "model_code/c.py"]  # configs.py: compared through the params a row records

    def label(commit, **row):
        return provenance.provenance({"dataset": "toy", "config": "bm25", "commit": commit, **row}, "run", tmp_path)

    (tmp_path / "model_code" / "unrelated.py").write_text("U = 2\n")
    (tmp_path / "benchmarks" / "configs.py").write_text("X = 2\n")  # the loader: compared through the params
    (tmp_path / "benchmarks" / "configs" / "other.yaml").write_text("retriever: {kind: svdr}\n")  # another configuration
    git("commit", "-qam", "elsewhere")
    bm25 = resolve_params(PIPELINE_CONFIGS["bm25"], tmp_path / "toy").model_dump(mode="json")
    assert label(first, params=bm25) == f"current ({first})"
    assert label(first) == f"current ({first})"  # no params: only its own configuration's files count
    (tmp_path / "benchmarks" / "configs" / "_base.yaml").write_text("encoder: {max_query_length: 32}\n")
    git("commit", "-qam", "its base")
    assert label(first) == f"**stale**: 1 file(s) it depends on changed since {first} (benchmarks/configs/_base.yaml)"
    assert label(first, params=bm25) == f"current ({first})"  # with params: compared through the params instead
    assert "benchmarks/configs/other.yaml" in label(first, config="gone")  # no longer defined: every file counts
    drifted = {**bm25, "retriever": {**bm25["retriever"], "bm25": {**bm25["retriever"]["bm25"], "k1": 9.0}}}
    assert "config now resolves to other params (retriever.bm25.k1)" in label(first, params=drifted)
    (tmp_path / "model_code" / "c.py").write_text("C = 2\n")
    assert label(first, params=bm25) == f"current ({first})"  # uncommitted: judged against HEAD only
    git("commit", "-qam", "change c")
    assert label(first, params=bm25) == (f"**stale**: 1 file(s) it depends on changed since {first} "
                                         "(model_code/c.py)")
    assert label(None) == provenance.NO_COMMIT
    assert label(f"{first}+dirty", params=bm25).startswith(f"dirty: uncommitted code at {first}, not reproducible; "
                                                           "**stale**")
    assert "not in this repository's history" in label("0000000")

    results = tmp_path / "benchmarks" / "results" / "toy"
    results.mkdir(parents=True)
    (results / "bm25.json").write_text(json.dumps({**result("bm25", 0.7), "commit": first, "params": bm25,
                                                   "note": "shared | the cores"}))
    (results / "new.json").write_text(json.dumps({**result("new", 0.6), "commit": git("rev-parse", "--short", "HEAD")}))
    write_results_table(results.parent, tmp_path / "RESULTS.md", root=tmp_path)
    text = (tmp_path / "RESULTS.md").read_text()
    assert f"| bm25 | 0.7000 | 0.9000 | 0.5000 | 60 | 12.5 | 100 | test machine | 2026-01-01 | {label(first, params=bm25)} |" in text
    assert "| new | 0.6000 |" in text and "its config is no longer defined" not in text  # no params: not compared
    assert f"judged against the code at commit {git('rev-parse', '--short', 'HEAD')}" in " ".join(text.split())
    notes = text[text.index("## Hand-written notes (not from code)"):]
    assert "| toy | bm25 | shared \\| the cores |" in notes and "| new |" not in notes
    write_results_table(results.parent, tmp_path / "RESULTS-again.md", root=tmp_path)
    assert (tmp_path / "RESULTS-again.md").read_text() == text


def test_every_published_row_names_a_clean_commit_in_history_and_its_params():
    """Issue #26: rows in benchmarks/results/ can be reproduced; older ones live in benchmarks/archive/."""
    project = provenance.PROJECT
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=project, capture_output=True, check=False).returncode:
        pytest.skip("not a git checkout: cannot check that the rows' commits exist")
    rows = sorted([*project.glob("benchmarks/results/*/*.json"), *project.glob("benchmarks/results/*/sweeps/*.json")])
    assert rows
    for path in rows:
        row = json.loads(path.read_text())
        commit = row.get("commit") or ""
        assert commit and not commit.endswith("+dirty") and not row.get("dirty"), path
        assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=project, capture_output=True,
                              check=False).returncode == 0, f"{path}: {commit} not in history"
        assert isinstance(row.get("params"), dict) and "note" not in row, path
        assert archive_reasons(row) == [], path


def test_archived_rows_are_listed_apart_with_why(tmp_path):
    (tmp_path / "results" / "toy").mkdir(parents=True)
    (tmp_path / "results" / "toy" / "bm25.json").write_text(json.dumps({**result("bm25", 0.7), "commit": "abc1234",
                                                                         "params": {}}))
    (tmp_path / "archive" / "toy").mkdir(parents=True)
    (tmp_path / "archive" / "toy" / "old.json").write_text(json.dumps({**result("old", 0.5), "note": "by hand"}))
    (tmp_path / "archive" / "toy" / "later.json").write_text(json.dumps({**result("later", 0.6),
                                                                          "commit": "abc1234+dirty"}))
    write_results_table(tmp_path / "results", tmp_path / "RESULTS.md")
    text = (tmp_path / "RESULTS.md").read_text()
    published, archive = text.split("## Archive: rows measured before the protocol (not reproducible; "
                                    "not evidence for any claim)")
    assert "| bm25 | 0.7000 |" in published and "| old |" not in published and "| later |" not in published
    assert "| toy | old.json | no commit, no resolved params, hand-written note |" in archive
    assert "| toy | later.json | uncommitted code, no resolved params |" in archive
    assert "| old | 0.5000 |" in archive and "| toy | old | by hand |" in archive and "| bm25 |" not in archive


@pytest.mark.parametrize("harness", ["incremental", "freshness", "clustering", "sweep", "shared_training"])
def test_every_harness_refuses_uncommitted_code_before_running(harness, beir_dir, monkeypatch, capsys):
    import importlib

    module = importlib.import_module(f"benchmarks.{harness}")
    monkeypatch.setattr(benchmark_run, "code_version", lambda results=None: "abc1234+dirty")
    args = {"incremental": ["--data", str(beir_dir)], "freshness": ["--data", str(beir_dir)],
            "clustering": ["--sizes", "10"],
            "sweep": ["--data", str(beir_dir), "--name", "x", "--base", "bm25", "--baseline", "bm25",
                      "--grid", "retriever.bm25.k1=[1.2]"],
            "shared_training": ["--data", str(beir_dir), "--configs", "svdr-full", "svdr-beta"]}[harness]
    with pytest.raises(SystemExit) as refused:
        module.main(args)
    assert refused.value.code == 2 and "uncommitted code changes" in capsys.readouterr().err  # before any work


def test_a_freshness_row_is_compared_through_the_params_its_overrides_give_now(tmp_path, monkeypatch):
    """A freshness-calibration row records the harness's overrides: its params are re-resolved from
    the shipped params.yaml with them (a drifted setting is named), and params.yaml then no longer
    counts as a file dependency; a row from before overrides were recorded still counts it."""
    from benchmarks import freshness

    overrides = freshness.champion_overrides(zero_shot=True, max_passage_length=64)
    shipped = yaml.safe_load(PARAMS_FILE.read_text())
    written = tmp_path / "params.yaml"  # as the harness writes the champion's workspace params
    written.write_text(yaml.safe_dump({**shipped, **{k: {**shipped.get(k, {}), **v} for k, v in overrides.items()},
                                       "data": {**shipped.get("data", {}), **overrides["data"], "path": "/w/src"}}))
    recorded = load_params(written).model_dump(mode="json")
    assert recorded["train"]["enabled"] is False and recorded["encoder"]["max_passage_length"] == 64
    as_shipped = Params.model_validate(shipped).model_dump(mode="json")
    row = {"params": recorded, "overrides": overrides, "shipped_params": as_shipped}

    def drift(**changed):
        return [provenance.params_drift(now, rec) for now, rec in freshness.expected_params({**row, **changed})]

    assert drift() == [[], []]
    assert drift(params={**recorded, "train": {**recorded["train"], "enabled": True}}) == [["train.enabled"], []]
    # the shipped file's own thresholds (the params_thresholds outcomes) are compared too
    thresholds = {**as_shipped["freshness"]["thresholds"], "max_volume_ratio": 123.0}
    assert drift(shipped_params={**as_shipped, "freshness": {**as_shipped["freshness"], "thresholds": thresholds}}) \
        == [[], ["freshness.thresholds.max_volume_ratio"]]
    # an override of a setting that no longer exists: stale, not a crash
    assert drift(overrides={**overrides, "eval": {"split": "dev", "gone": 1}}) == [["config"], []]
    monkeypatch.setattr(provenance, "changed_files", lambda commit, root: frozenset({"params.yaml"}))
    assert provenance.provenance({**row, "commit": "abc1234"}, "freshness") == "current (abc1234)"
    before = {"params": recorded, "commit": "abc1234"}  # written before the harness recorded its overrides
    assert provenance.provenance(before, "freshness") == (
        "**stale**: 1 file(s) it depends on changed since abc1234 (params.yaml)")


def test_a_setting_added_after_a_row_was_measured_is_no_drift_at_its_default():
    """A row recorded before ``index.ef_search`` existed still resolves to the same run while the
    new setting is at its default (the defaults come from ``Params``, not from this test's values),
    and not when it is set to something else or a setting the row recorded changed."""
    from model_code.config import IndexParams

    recorded = {"index": {"factory": "Flat"}, "train": {"max_steps": 5}}
    default = IndexParams().ef_search
    assert provenance.params_drift({"index": {"factory": "Flat", "ef_search": default}, "train": {"max_steps": 5}},
                                   recorded) == []
    assert provenance.params_drift({"index": {"factory": "Flat", "ef_search": default + 1},
                                    "train": {"max_steps": 5}}, recorded) == ["index.ef_search"]
    assert provenance.params_drift({"index": {"factory": "Flat"}, "train": {"max_steps": 6}},
                                   recorded) == ["train.max_steps"]
    assert provenance.params_drift({"index": {"factory": "Flat", "unknown": 1}, "train": {"max_steps": 5}},
                                   recorded) == ["index.unknown"]  # not a setting Params has: a difference


def test_the_endpoints_settings_are_no_drift():
    """``serve`` (request limits, the follower's polling) changes no measured number: a row stays
    current when they change, while a change beside them still counts."""
    recorded = {"serve": {"max_k": 5, "refresh_seconds": 1.0}, "index": {"factory": "Flat"}}
    assert provenance.params_drift({"serve": {"max_k": 6, "refresh_seconds": 0.25}, "index": {"factory": "Flat"}},
                                   recorded) == []
    assert provenance.params_drift({"serve": {"max_k": 6}, "index": {"factory": "IVF"}}, recorded) == ["index.factory"]


def test_a_pipeline_row_ignores_the_freshness_settings_it_never_reads(tmp_path, monkeypatch):
    """A pipeline run stops at the evaluation, so a change to params.yaml's freshness section alone
    (the drift thresholds) leaves its row current, while a change of what it trains is stale; the
    freshness harness's own rows compare those thresholds (test above)."""
    monkeypatch.setattr(provenance, "changed_files", lambda commit, root: frozenset())
    recorded = resolve_params(PIPELINE_CONFIGS["bm25"], tmp_path).model_dump(mode="json")
    row = {"config": "bm25", "commit": "abc1234", "params": recorded}
    assert provenance.provenance(row, "run") == "current (abc1234)"
    moved = {**recorded["freshness"]["thresholds"], "max_similarity_ks": 0.99}
    older = {**recorded, "freshness": {**recorded["freshness"], "thresholds": moved}}
    assert provenance.provenance({**row, "params": older}, "run") == "current (abc1234)"
    trained = {**recorded, "train": {**recorded["train"], "max_steps": recorded["train"]["max_steps"] + 1}}
    assert provenance.provenance({**row, "params": trained}, "run") == (
        "**stale**: its config now resolves to other params (train.max_steps)")
    assert provenance.params_drift(recorded, older) == ["freshness.thresholds.max_similarity_ks"]


def test_no_stage_a_pipeline_row_runs_declares_a_section_provenance_takes_it_not_to_read():
    """The stages ``benchmarks.run`` executes (every ``fresh-retriever`` stage; register is another
    command) declare the params sections they read: none is one ``UNREAD_SECTIONS`` leaves out of a
    pipeline row's comparison, so a stage that starts reading one fails here first."""
    from model_code.stages.pipeline import STAGES

    unread = provenance.UNREAD_SECTIONS["run"]
    read = {section.split(".")[0] for stage in STAGES if stage.command == "fresh-retriever"
            for section in stage.params_sections()}
    assert read and not read & unread, read & unread
