"""Write ``tests/mutation/REPORT.md`` from ``summary.json`` (``run.py``), ``deliberate_errors.json``
(``deliberate_errors.py``) and the explanations of surviving mutants in ``survivors.py``: short enough
to read, with the gaps (survivors not explained) in full. Where this machine holds the full results
(``out/results.json``), also ``out/REPORT.md`` with every survivor and killer check."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from importlib.metadata import version
from pathlib import Path

from run import KILLED, MODULES, RESULTS, SUMMARY, module_of, scratch_copy, select_modules  # type: ignore[import-not-found]
from survivors import EQUIVALENT, EQUIVALENT_REPLACEMENTS, KILLED_BY  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent


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


def measured_at(entry: dict) -> str:
    """The commit of the module's last full measurement and of later re-tests of its survivors."""
    retests = entry.get("retested_at", [])
    return f"`{entry['commit']}`" + (f" (survivors re-tested at {', '.join(f'`{c}`' for c in retests)})"
                                     if retests else "")


def currency(summary: dict) -> dict[str, str]:
    """Per module: whether its results are current with HEAD's files (its fingerprint), and if not why."""
    head = scratch_copy()
    try:
        rerun, _ = select_modules(summary, head)
    finally:
        shutil.rmtree(head, ignore_errors=True)
    return {module: "yes" if module not in rerun else f"no: {rerun[module]}" for module in MODULES}


def make_line(make: dict, name: str) -> str:
    if make["all"]:
        what = f"every module ({len(make['rerun'])})"
    else:
        what = (f"{len(make['rerun'])} changed module(s)" + (f" ({', '.join(f'`{m}`' for m in make['rerun'])})"
                                                              if make["rerun"] else "")
                + f", {len(make['kept'])} kept")
    return (f"{name} at commit `{make['commit']}`, re-mutating {what}: **{make['seconds'] // 60} min "
            f"{make['seconds'] % 60} s** wall time on {make['cpus']} cores with {make['workers']} mutmut "
            f"workers (deliberate errors {make['deliberate_errors_seconds']} s, mutmut "
            f"{make['mutmut_seconds']} s; load average {make['load_at_start']} at the start, "
            f"{make['load_at_end']} at the end, other jobs included). The processes it started used "
            f"{make['cpu_seconds']} s of CPU time, {make['cpu_seconds'] / make['cpus'] / 60:.1f} min of "
            f"{make['cpus']} cores: about its wall time on an otherwise idle machine.")


def run_line(run: dict) -> str:
    what = (f"re-test of the {run['retested_survivors']} survivors of an earlier run of"
            if "retested_survivors" in run else "all mutants of")
    return (f"* commit `{run['commit']}`: {what} {', '.join(f'`{m}`' for m in run['modules'])} — "
            f"{run['seconds'] // 60} min {run['seconds'] % 60} s with {run['workers']} worker(s) (load average "
            f"{run['load_at_start']} at the start, {run['load_at_end']} at the end, other jobs included)"
            + (f"; tests `{' '.join(run['tests'])}`" if "tests" in run else ""))


def survivor_line(m: dict) -> str:
    change = "; ".join(f"`{line}`" for line in changed_lines(m.get("diff", ""))) or "(no diff)"
    return f"* `{m['name']}` ({m['status']}): {change} — {explanation(m) or '**not explained**'}"


def score_table(summary: dict) -> list[str]:
    """Per module and in all: mutants, killed, survivors explained as equivalent and not (an
    unexplained survivor that survivors.py explains since counts as equivalent), score, currency."""
    current = currency(summary)
    lines = [("| module | mutants | killed | survived: equivalent | survived: not explained | no tests | score | "
              "score without equivalents | measured at | current |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    totals = Counter()
    for module, entry in summary["modules"].items():
        unexplained = [m for m in entry["unexplained"] if explanation(m) is None]
        no_tests = sum(m["status"] == "no tests" for m in unexplained)
        n, killed = entry["mutants"], entry["killed"]
        equivalent = n - killed - len(unexplained)
        totals.update(mutants=n, killed=killed, equivalent=equivalent, open=len(unexplained) - no_tests,
                      no_tests=no_tests)
        lines.append(f"| `{module}` | {n} | {killed} | {equivalent} | {len(unexplained) - no_tests} | {no_tests} | "
                     f"{killed / n:.1%} | {killed / max(1, n - equivalent):.1%} | {measured_at(entry)} | "
                     f"{current.get(module, 'not a module of run.py any more')} |")
    for module in MODULES:
        if module not in summary["modules"]:
            lines.append(f"| `{module}` | not run yet (`.venv/bin/python tests/mutation/run.py --modules {module}`) "
                         "| | | | | | | | |")
    t = totals
    lines.append(f"| **all** | {t['mutants']} | {t['killed']} | {t['equivalent']} | {t['open']} | {t['no_tests']} | "
                 f"{t['killed'] / max(1, t['mutants']):.1%} | {t['killed'] / max(1, t['mutants'] - t['equivalent']):.1%} "
                 "| | |")
    return lines


def killer_lines(summary: dict, results: dict | None) -> list[str]:
    """survivors.KILLED_BY's checks: their count and the pairs whose test did not fail or was not
    checked (summary), and with the full results each pair of the modules measured here."""
    entries = summary["modules"].values()
    failing = [name for entry in entries for name in entry["killers_not_failing"]]
    checked = sum(entry["killer_checks"] for entry in entries)
    lines = [f"{checked - len(failing)} of the {len(KILLED_BY)} pairs fail on their mutant as they should."]
    lines += [f"* `{name}`: its test does **not** fail on it" for name in failing]
    if checked < len(KILLED_BY):
        lines.append(f"* {len(KILLED_BY) - checked} not checked yet (their module was not re-run since the pair "
                     "was added)")
    if results is not None:
        measured, verdicts = {m["module"] for m in results["mutants"]}, results.get("killers", {})
        lines += ["", "Each pair of the modules measured on this machine:", "",
                  "| mutant | its change | test | fails on it |", "|---|---|---|---|"]
        for name, test, change in KILLED_BY:
            if module_of(name) in measured:
                result = verdicts.get(name)
                verdict = "not checked yet" if result is None else ("yes" if result["fails"] else "**no**")
                lines.append(f"| `{name.rsplit('.', 1)[-1]}` ({name.split('.x')[0]}) | `{change}` | `{test}` | "
                             f"{verdict} |")
    return lines


def report(summary: dict, deliberate: dict, results: dict | None) -> str:
    """The report: from the summary alone (committed), or with ``results`` (the full results of this
    machine's runs) every survivor, every killer check and each run's test selection too."""
    lines = [
        "# Mutation report: the method cores",
        "",
        "Written by `tests/mutation/report.py` (do not edit by hand) from `tests/mutation/summary.json`"
        + (" and the full results in `tests/mutation/out/results.json`." if results is not None else
           "; `make mutation` writes the full report, every survivor and check, to `tests/mutation/out/`"
           " (git-ignored)."),
        "`make mutation` re-mutates only the modules whose source or test files changed since their results were",
        "measured (a fingerprint per module in `summary.json`: sha256 of the module and of each file of its test",
        "selection, and the commit) and keeps the others' results; `make mutation-full` re-mutates every module.",
        "Both run the deliberate errors.",
        f"Tool: mutmut {version('mutmut')}, run on a scratch copy of the committed tree, against the fast unit tests",
        "only (no training or pipeline tests):",
        "",
    ]
    full, make = summary.get("make_full"), summary.get("make")
    if full:
        lines += [make_line(full, "`make mutation-full` (`run.py --make --all`)"), ""]
    if make and make != full:
        lines += [make_line(make, "`make mutation` (`run.py --make`)"), ""]
    lines += [run_line(run) for run in (results["runs"] if results is not None else summary["runs"])]
    lines += ["", "## Score per module", "", *score_table(summary), "",
              ("Score = killed / mutants; the last column leaves out the survivors explained as equivalent "
               "(they compute the same thing, so no test can kill them: `survivors.py` says why for each)."), "",
              "## The deliberate errors (issue #27, then MLR)", "",
              ("Each applied by `tests/mutation/deliberate_errors.py` to a copy of the commit named; the first "
               "failing test is named (`pytest -x`)."), "",
              "| error | file | commit | killed | by |", "|---|---|---|---|---|"]
    for e in deliberate["errors"]:
        lines.append(f"| {e['error']} | `{e['file']}` | `{e['commit']}` | {'yes' if e['killed'] else '**no**'} | "
                     f"{', '.join(f'`{k}`' for k in e['killed_by']) or '—'} |")
    lines += ["", "## Survivors of a first run that a test written for them kills", "",
              ("Each test run alone against its mutant in the scratch copy of the last run of the module "
               "(`killers.py`: it fails with the mutant active and passes without it)."), "",
              *killer_lines(summary, results), ""]
    if results is not None:
        lines += ["## Survivors", "",
                  ("Every mutant that no test killed in the modules measured on this machine, with why it is "
                   "equivalent; an unexplained one is a gap."), ""]
        lines += [survivor_line(m) for m in sorted(results["mutants"], key=lambda m: m["name"])
                  if m["status"] not in KILLED]
    else:
        unexplained = [m for entry in summary["modules"].values() for m in entry["unexplained"]
                       if explanation(m) is None]
        none = "None: `survivors.py` explains every survivor as equivalent."
        lines += ["## Survivors not explained (the gaps)", "", *([survivor_line(m) for m in unexplained] or [none])]
    return "\n".join(lines) + "\n"


def main() -> None:
    summary = json.loads(SUMMARY.read_text())
    deliberate = json.loads((HERE / "deliberate_errors.json").read_text())
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else None
    (HERE / "REPORT.md").write_text(report(summary, deliberate, None))
    if results is not None:
        (RESULTS.parent / "REPORT.md").write_text(report(summary, deliberate, results))


if __name__ == "__main__":
    main()
