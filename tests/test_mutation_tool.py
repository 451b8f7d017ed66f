"""``make mutation``'s bookkeeping (tests/mutation/run.py), without running mutmut: the per-module
fingerprints and the choice of the modules an incremental run re-mutates, on a tmp folder."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    "pkg/no_fingerprint.py": ["tests/test_c.py"],
}


def write_tree(root: Path) -> None:
    for path in [*MODULE_TESTS, "tests/test_a.py", "tests/test_b.py", "tests/test_c.py"]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"# {path}\nx = 1\n")


def recorded_results(root: Path) -> dict:
    """results.json as a run at commit abc1234 leaves it: every module measured, all but one fingerprinted."""
    fingerprints = {m: {"commit": "abc1234", **run.fingerprint(m, root, MODULE_TESTS)}
                    for m in MODULE_TESTS if m != "pkg/no_fingerprint.py"}
    mutants = [{"name": m.removesuffix(".py").replace("/", ".") + ".x_f__mutmut_1", "module": m, "status": "killed"}
               for m in MODULE_TESTS]
    return {"runs": [], "mutants": mutants, "fingerprints": fingerprints}


def test_selection_reruns_changed_and_unfingerprinted_modules_and_keeps_the_unchanged(tmp_path):
    write_tree(tmp_path)
    results = recorded_results(tmp_path)
    (tmp_path / "pkg/changed_source.py").write_text("# pkg/changed_source.py\nx = 2\n")
    (tmp_path / "tests/test_b.py").write_text("# tests/test_b.py\nx = 2\n")

    rerun, kept = run.select_modules(results, tmp_path, module_tests=MODULE_TESTS)

    assert kept == ["pkg/unchanged.py"]
    assert set(rerun) == {"pkg/changed_source.py", "pkg/changed_tests.py", "pkg/no_fingerprint.py"}
    assert rerun["pkg/changed_source.py"].startswith("source changed")
    assert rerun["pkg/changed_tests.py"] == "tests changed (tests/test_b.py)"
    assert rerun["pkg/no_fingerprint.py"] == "never fingerprinted"


def test_nothing_changed_keeps_every_fingerprinted_module(tmp_path):
    write_tree(tmp_path)
    rerun, kept = run.select_modules(recorded_results(tmp_path), tmp_path, module_tests=MODULE_TESTS)
    assert rerun == {"pkg/no_fingerprint.py": "never fingerprinted"}
    assert kept == ["pkg/changed_source.py", "pkg/changed_tests.py", "pkg/unchanged.py"]


def test_results_written_before_fingerprints_count_as_changed(tmp_path):
    write_tree(tmp_path)
    old = {k: v for k, v in recorded_results(tmp_path).items() if k != "fingerprints"}  # the old schema
    rerun, kept = run.select_modules(old, tmp_path, module_tests=MODULE_TESTS)
    assert kept == [] and set(rerun.values()) == {"never fingerprinted"}


def test_a_module_never_measured_or_with_a_new_test_file_is_rerun(tmp_path):
    write_tree(tmp_path)
    results = recorded_results(tmp_path)
    results["mutants"] = [m for m in results["mutants"] if m["module"] != "pkg/unchanged.py"]
    tests = {**MODULE_TESTS, "pkg/changed_source.py": ["tests/test_a.py", "tests/test_c.py"]}
    rerun, _ = run.select_modules(results, tmp_path, module_tests=tests)
    assert rerun["pkg/unchanged.py"] == "never run"
    assert rerun["pkg/changed_source.py"] == "test selection changed (tests/test_c.py)"


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
