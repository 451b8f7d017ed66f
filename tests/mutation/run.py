"""``make mutation``: mutmut over the modules that hold the methods' mathematics, against their fast
unit tests only, in a scratch copy of the committed tree (the checkout is never touched).

    .venv/bin/python tests/mutation/run.py [--modules GLOB ...] [--max-children 2] [--keep DIR]

Modules sharing a test selection (``MODULE_TESTS``) are mutated in one mutmut run; after each
run its results replace that run's modules in ``tests/mutation/results.json`` (per mutant:
module, function, status and, for survivors, the diff), so ``--modules`` re-runs some modules
and keeps the others' results. Then ``REPORT.md`` is written (``report.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results.json"

# module -> the fast unit tests run against its mutants (pytest selection arguments)
HCE_TESTS = ["tests/test_method_hce.py", "tests/test_hce_loss.py", "tests/test_components.py"]
MODULE_TESTS = {
    "model_code/incremental/incdsi.py": ["tests/test_method_incdsi.py", "tests/test_incdsi.py", "-k", "not tuning"],
    "model_code/incremental/tuning.py": ["tests/test_method_incdsi.py", "tests/test_incdsi_head.py", "-k",
                                         "tuning or best_trial or f_beta or held_out or simulation or head_starts"],
    "model_code/eval/metrics.py": ["tests/test_components.py", "tests/test_incdsi_head.py", "-k",
                                   "metrics or head_starts or tuning"],
    "model_code/losses/contrastive.py": HCE_TESTS,
    "model_code/losses/hierarchical.py": HCE_TESTS,
    "model_code/hierarchy/tree.py": HCE_TESTS,
    "model_code/training/objectives.py": HCE_TESTS,
}
MODULES = list(MODULE_TESTS)
# ranx compiles its numba kernels in every fresh process (~15 s); compiled once in mutmut's fork
# server (its collection imports conftest), every mutant's process inherits them
WARM_UP = """

def _warm_up_ranx() -> None:
    from model_code.eval.metrics import evaluate

    evaluate({"q": {"a": 1}, "r": {"b": 1}}, {"q": {"a": 0.9, "c": 0.1}}, ["mrr@10", "recall@1", "recall@10", "ndcg@10"])
    evaluate({"q": {"a": 1}}, {"q": {"a": 0.9}}, ["mrr@10"])


_warm_up_ranx()
"""


def scratch_copy() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="mutation-"))
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    return directory


def setup_cfg(modules: list[str], tests: list[str]) -> str:
    def block(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    return ("[mutmut]\nsource_paths=model_code\n"
            f"only_mutate={block(modules)}\n"
            f"also_copy={block(['tests', 'pyproject.toml'])}\n"
            f"pytest_add_cli_args_test_selection={block(tests)}\n"
            "process_isolation=forkserver\n")


def mutmut(copy: Path, *args: str, check: bool = True) -> str:
    mutmut_bin = Path(sys.executable).with_name("mutmut")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    run = subprocess.run([str(mutmut_bin), *args], check=False, cwd=copy, capture_output=True, text=True, env=env)
    if check and run.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed ({run.returncode}):\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}")
    return run.stdout


def collect(copy: Path, modules: list[str], only: set[str] | None = None) -> list[dict]:
    """Every mutant's status (mutmut's own words) and, for survivors, its diff (``only``: those names)."""
    listing = mutmut(copy, "results", "--all", "true")
    mutants = []
    for line in listing.splitlines():
        if ":" not in line:
            continue
        name, status = (part.strip() for part in line.rsplit(":", 1))
        if only is not None and name not in only:
            continue
        module = name.split(".x")[0].replace(".", "/") + ".py"
        function = name.rsplit("__mutmut_", 1)[0].split(".", len(module.split("/")) - 1)[-1]
        entry = {"name": name, "module": module, "function": function, "status": status}
        if status not in ("killed", "timeout", "segfault"):
            entry["diff"] = mutmut(copy, "show", name, check=False)
        mutants.append(entry)
    return [m for m in mutants if m["module"] in modules]


def retest(module: str, max_children: int) -> None:
    results = json.loads(RESULTS.read_text())
    names = [m["name"] for m in results["mutants"] if m["module"] == module and m["status"] not in KILLED]
    if not names:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    copy = scratch_copy()
    (copy / "setup.cfg").write_text(setup_cfg([module], MODULE_TESTS[module]))
    with open(copy / "tests" / "conftest.py", "a") as conftest:
        conftest.write(WARM_UP)
    start = time.perf_counter()
    mutmut(copy, "run", "--max-children", str(max_children), *names)
    fresh = {m["name"]: m for m in collect(copy, [module], set(names))}
    results["mutants"] = [fresh.get(m["name"], m) if m["name"] in names else m for m in results["mutants"]]
    results["runs"].append({"commit": commit, "modules": [module], "seconds": round(time.perf_counter() - start),
                            "workers": max_children, "tests": MODULE_TESTS[module],
                            "retested_survivors": len(names)})
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(copy, ignore_errors=True)


KILLED = {"killed", "timeout", "segfault"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modules", nargs="*", help="only these modules (paths as in MODULES)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    parser.add_argument("--survivors-of", metavar="MODULE",
                        help="re-test only the mutants of MODULE that survived in results.json (after adding tests: a "
                             "mutant killed before stays killed by a larger suite)")
    args = parser.parse_args()
    if args.survivors_of:
        retest(args.survivors_of, args.max_children)
        subprocess.run([sys.executable, str(HERE / "report.py")], check=True)
        return
    modules = args.modules or MODULES
    unknown = set(modules) - set(MODULES)
    if unknown:
        raise SystemExit(f"not a method-core module: {sorted(unknown)}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    groups: dict[tuple[str, ...], list[str]] = {}  # modules sharing a test selection run together
    for module in modules:
        groups.setdefault(tuple(MODULE_TESTS[module]), []).append(module)
    for tests, group in groups.items():
        copy = scratch_copy()
        (copy / "setup.cfg").write_text(setup_cfg(group, list(tests)))
        with open(copy / "tests" / "conftest.py", "a") as conftest:
            conftest.write(WARM_UP)
        start = time.perf_counter()
        print(f"mutmut in {copy} over {group}, {args.max_children} worker(s)", flush=True)
        mutmut(copy, "run", "--max-children", str(args.max_children))
        seconds = round(time.perf_counter() - start)
        mutants = collect(copy, group)
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": [], "mutants": []}
        kept = [m for m in previous["mutants"] if m["module"] not in group]
        runs = [r for r in previous["runs"] if not set(r["modules"]) <= set(group)]
        runs.append({"commit": commit, "modules": group, "seconds": seconds, "workers": args.max_children,
                     "tests": list(tests)})
        RESULTS.write_text(json.dumps({"runs": runs, "mutants": kept + mutants}, indent=1) + "\n")
        print(f"  {len(mutants)} mutants, {seconds} s", flush=True)
        if not args.keep:
            shutil.rmtree(copy, ignore_errors=True)
    subprocess.run([sys.executable, str(HERE / "report.py")], check=True)


if __name__ == "__main__":
    main()
