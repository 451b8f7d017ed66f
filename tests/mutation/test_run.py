"""``make mutation``'s bookkeeping (tests/mutation/run.py), without running mutmut: the per-module
fingerprints, the choice of the modules an incremental run re-mutates, and the committed summary
(counts, gaps and fingerprints) beside the git-ignored full results, on a tmp folder."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

from tests.conftest import REPOSITORY

ROOT = REPOSITORY


def load_run():
    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "tests" / "mutation" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = load_run()

MODULE_TESTS = {
    "pkg/changed_source.py": ["tests/test_a.py"],
    "pkg/changed_tests.py": ["tests/test_b.py::test_one", "tests/test_b.py::test_two"],
    "pkg/unchanged.py": ["tests/test_a.py", "tests/test_c.py::test_x"],
    "pkg/never_run.py": ["tests/test_c.py"],
}


def write_tree(root: Path) -> None:
    for path in [*MODULE_TESTS, "tests/test_a.py", "tests/test_b.py", "tests/test_c.py"]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"# {path}\nx = 1\n")


def recorded_summary(root: Path) -> dict:
    """summary.json as a run at commit abc1234 leaves it: every module but one measured, with its
    fingerprint."""
    return {"modules": {m: {"commit": "abc1234", **run.fingerprint(m, root, MODULE_TESTS)}
                        for m in MODULE_TESTS if m != "pkg/never_run.py"}}


def test_selection_reruns_changed_and_unmeasured_modules_and_keeps_the_unchanged(tmp_path):
    write_tree(tmp_path)
    summary = recorded_summary(tmp_path)
    (tmp_path / "pkg/changed_source.py").write_text("# pkg/changed_source.py\nx = 2\n")
    (tmp_path / "tests/test_b.py").write_text("# tests/test_b.py\nx = 2\n")

    rerun, kept = run.select_modules(summary, tmp_path, module_tests=MODULE_TESTS)

    assert kept == ["pkg/unchanged.py"]
    assert set(rerun) == {"pkg/changed_source.py", "pkg/changed_tests.py", "pkg/never_run.py"}
    assert rerun["pkg/changed_source.py"].startswith("source changed")
    assert rerun["pkg/changed_tests.py"] == "tests changed (tests/test_b.py)"
    assert rerun["pkg/never_run.py"] == "never run"


def test_nothing_changed_keeps_every_measured_module(tmp_path):
    write_tree(tmp_path)
    rerun, kept = run.select_modules(recorded_summary(tmp_path), tmp_path, module_tests=MODULE_TESTS)
    assert rerun == {"pkg/never_run.py": "never run"}
    assert kept == ["pkg/changed_source.py", "pkg/changed_tests.py", "pkg/unchanged.py"]


def test_a_module_with_a_new_test_file_is_rerun(tmp_path):
    write_tree(tmp_path)
    tests = {**MODULE_TESTS, "pkg/changed_source.py": ["tests/test_a.py", "tests/test_c.py"]}
    rerun, _ = run.select_modules(recorded_summary(tmp_path), tmp_path, module_tests=tests)
    assert rerun["pkg/changed_source.py"] == "test selection changed (tests/test_c.py)"


def test_the_summary_keeps_counts_gaps_and_fingerprints_and_the_runs_whose_results_it_holds(tmp_path, monkeypatch):
    """A run's full results (git-ignored) become a per-module summary (committed): counts, the
    survivors survivors.py does not explain with their diffs, the killer checks that did not fail;
    a later run of one module replaces its entry only, and a run none of whose results is held any
    more is dropped; a re-test of survivors keeps the fingerprint and adds its commit."""
    monkeypatch.setattr(run, "SUMMARY", tmp_path / "summary.json")
    monkeypatch.syspath_prepend(str(run.HERE))  # run.py reads survivors.py's explanations through report.py
    diff = "--- a\n+++ b\n-    return x\n+    return None\n"
    results = {"mutants": [
        {"name": "pkg.a.x_f__mutmut_1", "module": "pkg/a.py", "status": "killed"},
        {"name": "pkg.a.x_f__mutmut_2", "module": "pkg/a.py", "status": "survived", "diff": diff},
        {"name": "pkg.b.x_g__mutmut_1", "module": "pkg/b.py", "status": "timeout"}],
        "killers": {"pkg.a.x_f__mutmut_3": {"fails": False}, "pkg.a.x_f__mutmut_4": {"fails": True}}}
    first = {"commit": "c1", "modules": ["pkg/a.py", "pkg/b.py"], "seconds": 5, "tests": ["tests/test_a.py"]}
    prints = {m: {"commit": "c1", "source": {m: "0" * 64}, "tests": {}} for m in ("pkg/a.py", "pkg/b.py")}
    run.summarize(results, ["pkg/a.py", "pkg/b.py"], first, prints)
    summary = json.loads(run.SUMMARY.read_text())
    a = summary["modules"]["pkg/a.py"]
    assert (a["commit"], a["mutants"], a["killed"], a["equivalent"]) == ("c1", 2, 1, 0)
    assert a["unexplained"] == [{"name": "pkg.a.x_f__mutmut_2", "status": "survived", "diff": diff}]
    assert (a["killer_checks"], a["killers_not_failing"]) == (2, ["pkg.a.x_f__mutmut_3"])
    assert summary["modules"]["pkg/b.py"]["killed"] == 1  # a timeout kills
    assert summary["runs"] == [{k: v for k, v in first.items() if k != "tests"}]  # selections stay in out/

    results["mutants"][1]["status"] = "killed"
    retest = {"commit": "c2", "modules": ["pkg/a.py"], "seconds": 1, "retested_survivors": 1}
    run.summarize(results, ["pkg/a.py"], retest)
    a = json.loads(run.SUMMARY.read_text())["modules"]["pkg/a.py"]
    assert (a["commit"], a["retested_at"], a["source"], a["killed"], a["unexplained"]) == (
        "c1", ["c2"], prints["pkg/a.py"]["source"], 2, [])

    second = {"commit": "c3", "modules": ["pkg/a.py", "pkg/b.py"], "seconds": 4}
    run.summarize(results, ["pkg/a.py", "pkg/b.py"], second, {m: {**p, "commit": "c3"} for m, p in prints.items()})
    assert [r["commit"] for r in json.loads(run.SUMMARY.read_text())["runs"]] == ["c3"]


def test_the_full_results_are_git_ignored_and_the_summary_is_committed():
    ignored = subprocess.run(["git", "check-ignore", "-q", str(run.RESULTS)], cwd=ROOT, check=False).returncode
    assert ignored == 0 and run.RESULTS.parent != run.SUMMARY.parent
    assert run.SUMMARY.is_file() and len(run.SUMMARY.read_text().splitlines()) < 1000


def test_the_fingerprint_hashes_every_test_file_and_changes_with_one_byte(tmp_path):
    write_tree(tmp_path)
    before = run.fingerprint("pkg/unchanged.py", tmp_path, MODULE_TESTS)
    assert set(before["tests"]) == {"tests/test_a.py", "tests/test_c.py"}  # file::test ids hash their file
    assert all(re.fullmatch("[0-9a-f]{64}", digest) for digest in [*before["source"].values(),
                                                                   *before["tests"].values()])
    path = tmp_path / "tests/test_c.py"
    data = bytearray(path.read_bytes())
    data[-2] ^= 1  # one byte
    path.write_bytes(bytes(data))
    after = run.fingerprint("pkg/unchanged.py", tmp_path, MODULE_TESTS)
    assert after["source"] == before["source"]
    assert after["tests"]["tests/test_a.py"] == before["tests"]["tests/test_a.py"]
    assert after["tests"]["tests/test_c.py"] != before["tests"]["tests/test_c.py"]
    assert run.why_rerun("pkg/unchanged.py", before, tmp_path, MODULE_TESTS) == "tests changed (tests/test_c.py)"


def test_every_real_module_has_test_files_that_exist():
    for module in run.MODULES:
        assert (ROOT / module).is_file()
        assert all((ROOT / path).is_file() for path in run.test_files(module)), module


def test_the_makefile_has_an_incremental_and_a_full_target_and_the_readme_says_which_is_which():
    makefile = (ROOT / "Makefile").read_text()
    incremental_target = r"^mutation: install\n\t\$\(BIN\)/python tests/mutation/run\.py --make\n"
    full_target = r"^mutation-full: install\n\t\$\(BIN\)/python tests/mutation/run\.py --make --all\n"
    assert re.search(incremental_target, makefile, re.MULTILINE)
    assert re.search(full_target, makefile, re.MULTILINE)
    readme = (ROOT / "README.md").read_text()
    [incremental] = [line for line in readme.splitlines() if line.startswith("make mutation ")]
    assert "incremental" in incremental and "over an hour" not in incremental
    [full] = [line for line in readme.splitlines() if line.startswith("make mutation-full")]
    assert "every module" in full and "over an hour on 2 cores" in full
