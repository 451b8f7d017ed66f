"""Write ``tests/mutation/REPORT.md`` from ``results.json`` (``run.py``), ``deliberate_errors.json``
(``deliberate_errors.py``) and the explanations of surviving mutants in ``survivors.py``."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from importlib.metadata import version
from pathlib import Path

from run import MODULES, scratch_copy, select_modules  # type: ignore[import-not-found]
from survivors import EQUIVALENT, EQUIVALENT_REPLACEMENTS, KILLED_BY  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
KILLED = {"killed", "timeout", "segfault"}


def changed_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def replacements(diff: str) -> list[str]:
    """Each changed line as "old -> new": a mutant whose new line says nothing by itself (a call's
    last argument dropped leaves a bare ``)``) is told apart by the line it replaced."""
    lines = diff.splitlines()
    old = [line[1:].strip() for line in lines if line.startswith("-") and not line.startswith("---")]
    return [f"{before} -> {after}" for before, after in zip(old, changed_lines(diff))]


def explanation(mutant: dict) -> str | None:
    diff = mutant.get("diff", "")
    for rules, texts in ((EQUIVALENT, changed_lines(diff)), (EQUIVALENT_REPLACEMENTS, replacements(diff))):
        for module, pattern, why in rules:
            if re.fullmatch(module, mutant["module"]) and any(re.search(pattern, text) for text in texts):
                return why
    return None


def measured_at(results: dict, module: str) -> str:
    """The commit of the module's last full measurement and of later re-tests of its survivors."""
    runs, recorded = results["runs"], results.get("fingerprints", {}).get(module)
    full = [i for i, run in enumerate(runs) if module in run["modules"] and "retested_survivors" not in run]
    commit = recorded["commit"] if recorded else (runs[full[-1]]["commit"] if full else None)
    if commit is None:
        return "—"
    last_full = full[-1] if full else -1
    retests = list(dict.fromkeys(run["commit"] for run in runs[last_full + 1:]
                                 if module in run["modules"] and "retested_survivors" in run))
    return f"`{commit}`" + (f" (survivors re-tested at {', '.join(f'`{c}`' for c in retests)})" if retests else "")


def currency(results: dict) -> dict[str, str]:
    """Per module: whether its results are current with HEAD's files (its fingerprint), and if not why."""
    head = scratch_copy()
    try:
        rerun, _ = select_modules(results, head)
    finally:
        shutil.rmtree(head, ignore_errors=True)
    return {module: ("yes" if module not in rerun else
                     "unknown: results older than fingerprints, re-run by the next `make mutation`"
                     if rerun[module] == "never fingerprinted" else f"no: {rerun[module]}")
            for module in MODULES}


def make_line(make: dict, name: str) -> str:
    if "all" not in make:  # written before incremental runs: --make then re-mutated every module
        what = "every module of the time"
    elif make["all"]:
        what = f"every module ({len(make['rerun'])})"
    else:
        what = (f"{len(make['rerun'])} changed module(s)" + (f" ({', '.join(f'`{m}`' for m in make['rerun'])})"
                                                              if make["rerun"] else "")
                + f", {len(make['kept'])} kept")
    return (f"{name} at commit `{make['commit']}`, re-mutating {what}: **{make['seconds'] // 60} min "
            f"{make['seconds'] % 60} s** wall time on {make['cpus']} cores with {make['workers']} mutmut "
            f"workers (deliberate errors {make['deliberate_errors_seconds']} s, mutmut "
            f"{make['mutmut_seconds']} s; load average {make['load_at_start']} at the start, "
            f"{make['load_at_end']} at the end, other jobs included)."
            + (f" The processes it started used {make['cpu_seconds']} s of CPU time, "
               f"{make['cpu_seconds'] / make['cpus'] / 60:.1f} min of {make['cpus']} cores: about its "
               "wall time on an otherwise idle machine." if "cpu_seconds" in make else ""))


def main() -> None:
    results = json.loads((HERE / "results.json").read_text())
    deliberate = json.loads((HERE / "deliberate_errors.json").read_text())
    mutants = results["mutants"]
    lines = [
        "# Mutation report: the method cores",
        "",
        "Written by `tests/mutation/report.py` (do not edit by hand). `make mutation` re-mutates only the modules",
        "whose source or test files changed since their results were measured (a fingerprint per module in",
        "`results.json`: sha256 of the module and of each file of its test selection, and the commit) and keeps the",
        "others' results; `make mutation-full` re-mutates every module. Both run the deliberate errors.",
        f"Tool: mutmut {version('mutmut')}, run on a scratch copy of the committed tree, against the fast unit tests",
        "only (no training or pipeline tests):",
        "",
    ]
    for run in results["runs"]:
        what = (f"re-test of the {run['retested_survivors']} survivors of an earlier run of"
                if "retested_survivors" in run else "all mutants of")
        lines.append(f"* commit `{run['commit']}`: {what} {', '.join(f'`{m}`' for m in run['modules'])} — "
                     f"{run['seconds'] // 60} min {run['seconds'] % 60} s with {run['workers']} worker(s)"
                     + (f" (load average {run['load_at_start']} at the start, {run['load_at_end']} at the end, other "
                        "jobs included)" if "load_at_start" in run else "") + "; tests "
                     f"`{' '.join(run['tests'])}`")
    current = currency(results)
    unfingerprinted = [m for m in MODULES if current[m].startswith("unknown")]
    lines += ["", "## Score per module", ""]
    if unfingerprinted:
        lines += [(f"{len(unfingerprinted)} of {len(MODULES)} modules hold results measured before run.py recorded "
                   "fingerprints (none was made up afterwards): whether their source and tests changed since is not "
                   "known, so the next `make mutation` re-mutates them."), ""]
    lines += [("| module | mutants | killed | survived: equivalent | survived: not explained | no tests | score | "
              "score without equivalents | measured at | current |"),
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    by_module: dict[str, list[dict]] = {}
    for m in mutants:
        by_module.setdefault(m["module"], []).append(m)
    totals = Counter()
    for module in sorted(by_module):
        rows = by_module[module]
        killed = sum(m["status"] in KILLED for m in rows)
        equivalent = sum(m["status"] not in KILLED and explanation(m) is not None for m in rows)
        no_tests = sum(m["status"] == "no tests" and explanation(m) is None for m in rows)
        open_ = len(rows) - killed - equivalent - no_tests
        totals.update(mutants=len(rows), killed=killed, equivalent=equivalent, open=open_, no_tests=no_tests)
        lines.append(f"| `{module}` | {len(rows)} | {killed} | {equivalent} | {open_} | {no_tests} | "
                     f"{killed / len(rows):.1%} | {killed / max(1, len(rows) - equivalent):.1%} | "
                     f"{measured_at(results, module)} | {current.get(module, 'not a module of run.py any more')} |")
    for module in MODULES:
        if module not in by_module:
            lines.append(f"| `{module}` | not run yet (`.venv/bin/python tests/mutation/run.py --modules {module}`) "
                         "| | | | | | | | |")
    t = totals
    lines.append(f"| **all** | {t['mutants']} | {t['killed']} | {t['equivalent']} | {t['open']} | {t['no_tests']} | "
                 f"{t['killed'] / max(1, t['mutants']):.1%} | {t['killed'] / max(1, t['mutants'] - t['equivalent']):.1%} "
                 "| | |")
    lines += ["", ("Score = killed / mutants; the last column leaves out the survivors explained as equivalent "
              "below (they compute the same thing, so no test can kill them)."), "",
              "## The deliberate errors (issue #27, then MLR)", "",
              ("Each applied by `tests/mutation/deliberate_errors.py` to a copy of the commit named; the first "
              "failing test is named (`pytest -x`)."), "",
              "| error | file | commit | killed | by |", "|---|---|---|---|---|"]
    for e in deliberate["errors"]:
        lines.append(f"| {e['error']} | `{e['file']}` | `{e['commit']}` | {'yes' if e['killed'] else '**no**'} | "
                     f"{', '.join(f'`{k}`' for k in e['killed_by']) or '—'} |")
    timings = []
    full = results.get("make_full") or (results["make"] if "make" in results and "all" not in results["make"]
                                        else None)
    if full:
        timings.append(make_line(full, "`make mutation-full` (`run.py --make --all`)" if "all" in full
                                 else "`make mutation` (`run.py --make`, before it was incremental)"))
    if results.get("make") and results["make"] is not full:
        timings.append(make_line(results["make"], "`make mutation` (`run.py --make`)"))
    lines[9:9] = [line for timing in timings for line in (timing, "")]
    checked = results.get("killers", {})
    lines += ["", "## Survivors of a first run that a test written for them kills", "",
              ("Each test run alone against its mutant in the scratch copy of the last run of the module "
               "(`killers.py`: it fails with the mutant active and passes without it)."), "",
              "| mutant | its change | test | fails on it |", "|---|---|---|---|"]
    for name, test, change in KILLED_BY:
        result = checked.get(name)
        verdict = "not checked yet" if result is None else ("yes" if result["fails"] else "**no**")
        lines.append(f"| `{name.rsplit('.', 1)[-1]}` ({name.split('.x')[0]}) | `{change}` | `{test}` | {verdict} |")
    lines += ["", "## Survivors", "",
              "Every mutant that no test killed, with why it is equivalent; an unexplained one is a gap.", ""]
    for m in sorted(mutants, key=lambda m: m["name"]):
        if m["status"] in KILLED:
            continue
        why = explanation(m)
        change = "; ".join(f"`{line}`" for line in changed_lines(m.get("diff", ""))) or "(no diff)"
        lines.append(f"* `{m['name']}` ({m['status']}): {change} — {why or '**not explained**'}")
    (HERE / "REPORT.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
