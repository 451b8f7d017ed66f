"""Can a results row still be reproduced, and has the code it measured changed since?

A row names the commit it measured (``commit``, ``+dirty`` when uncommitted code ran). The files a
row depends on are the project modules its harness imports, directly or not, found the way
``model_code.stages.pipeline.import_closure`` finds a DVC stage's code dependencies, but following
imports inside functions too (the pipeline's are lazy) and adding the modules loaded by name
(every stage's module, the built-in retriever kinds), less the modules that only retriever kinds or
training methods the row did not run call (their method packages, ``owner``). Files changed between the row's commit and
``HEAD`` (git) that are among them make the row **stale**: the number may no longer be what the
code gives. ``params.yaml`` and the configuration files (``benchmarks/configs/``) are compared
through the fully resolved params a row records, re-resolved now from the same configuration
(``benchmarks.run`` and ``benchmarks.sweep``) or the same harness overrides
(``benchmarks.freshness``): a change to an unrelated setting or configuration does not make every
row stale. For a row without recorded params (or overrides) the files count as dependencies:
``params.yaml``, and for a configuration run the files its configurations are read from (each its
own and its bases', ``benchmarks.configs.config_files``), not the other configurations'.

Everything is read from git and the checkout, sorted, so the same repository state gives the same
labels (uncommitted changes are not considered: they have no commit to compare with).
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
# Presentation and configuration modules: a new configuration or report column does not change what
# an existing row measured (configurations are compared through the recorded params instead).
NOT_MEASURED = frozenset({"benchmarks.configs", "benchmarks.report", "benchmarks.provenance", "benchmarks.compare"})
PARAMS_FILE = "params.yaml"
# Modules that only one retriever kind (``retriever.kind``) or training method (``train.method``)
# calls: those of its method package, ``model_code/methods/<name>/`` (``owner``). A row's dependencies
# leave out those of the kinds and methods it did not run, so a change confined to SVDR's package
# leaves an HCE row current. Every row imports them (the kind registry imports every kind, the
# default training recipe HCE's training), but importing runs only their definitions, and what those
# define for everyone (each method's settings and their defaults) reaches a row through the params it
# records, which are compared separately. Everything outside the method packages (the stages, the
# encoder, the dense and BM25 retrievers, which the neural kinds and the mining stage build on, the
# contrastive loss, the corpus tree) counts for every row. ``tests/benchmarks/test_provenance.py`` traces a
# tiny run of every kind and method: each calls every module of its package and no function of another's.
METHODS = "model_code.methods"
# What a harness runs beside its recorded params' kind and method: benchmarks/incremental.py builds
# IncDSI heads over the dense encoder its params train.
HARNESS_RUNS = {"incremental": frozenset({"incdsi"})}
# Harnesses that run named configurations (benchmarks/configs/; their rows record the params)
CONFIGURATION_HARNESSES = ("run", "shared_training", "sweep")
# Params keys whose variation across a sweep's dev variants means they may have run other kinds or methods
RUN_SELECTORS = frozenset({"retriever.kind", "train.method", "index.backend"})
NO_COMMIT = "no commit: not reproducible"


def _packages(root: Path) -> frozenset[str]:
    """Top-level project packages (directories with an ``__init__.py``)."""
    return frozenset(p.parent.name for p in root.glob("*/__init__.py"))


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(file: Path, module: str, packages: frozenset[str]) -> set[str]:
    """Project modules ``file`` imports anywhere (module level or inside functions)."""
    found: set[str] = set()
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name.split(".")[0] in packages)
    return found


def module_closure(modules: Iterable[str], root: Path = PROJECT, exclude: Iterable[str] = NOT_MEASURED) -> list[str]:
    """Project files (paths relative to ``root``) that importing ``modules`` loads, directly or
    through other project modules, package ``__init__`` files included; ``exclude`` is not followed."""
    return list(_closure(tuple(sorted(modules)), root.resolve(), frozenset(exclude)))


@cache
def _closure(modules: tuple[str, ...], root: Path, skip: frozenset[str]) -> tuple[str, ...]:
    packages = _packages(root)
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        parts = todo.pop().split(".")
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            prefix = ".".join(parts[:depth])
            if prefix in seen or prefix in skip:
                continue
            file = _module_file(root, prefix)
            if file is not None:
                seen[prefix] = file
                todo.extend(_imports(file, prefix, packages))
    return tuple(sorted({file.relative_to(root).as_posix() for file in seen.values()}))


def harness_modules(harness: str, params: dict | None = None) -> list[str]:
    """The modules a harness loads: its own and, by name, the pipeline stages it runs and the
    built-in retriever kinds (``kind_class`` imports them all)."""
    from model_code.stages.pipeline import STAGES

    stages = [s for s in STAGES if s.command == "fresh-retriever"]
    if params is not None and not params.get("train", {}).get("enabled", True):
        stages = [s for s in stages if s.name not in ("querygen", "cluster")]  # benchmarks.run skips them
    by_harness = {
        "run": ["benchmarks.run", *(s.module for s in stages)],
        "sweep": ["benchmarks.sweep", "benchmarks.run", *(s.module for s in stages)],
        "shared_training": ["benchmarks.shared_training", "benchmarks.run", *(s.module for s in stages)],
        "incremental": ["benchmarks.incremental"],
        "freshness": ["benchmarks.freshness", *(s.module for s in STAGES)],
        "freshness_latency": ["benchmarks.freshness_latency", *(s.module for s in STAGES)],
        "svdr_index": ["benchmarks.svdr_index"],
        "index_cost": ["benchmarks.index_cost", *(s.module for s in stages)],
    }
    return [*by_harness[harness], "model_code.retrievers"]


def owner(module: str) -> str | None:
    """The kind or training method that alone calls ``module``: the name of the method package it
    lives in (``model_code.methods.<name>`` and below), None for a shared module."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and ".".join(parts[:2]) == METHODS else None


def owned_modules(root: Path = PROJECT) -> dict[str, tuple[str, ...]]:
    """Each method package's modules (the package itself included), by owner, as found under ``root``."""
    base = root.joinpath(*METHODS.split("."))
    owned: dict[str, list[str]] = {}
    for file in sorted(base.glob("*/**/*.py")):
        module = ".".join(file.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        owned.setdefault(owner(module), []).append(module)
    return {name: tuple(modules) for name, modules in owned.items()}


def backend_modules() -> dict[str, tuple[str, ...]]:
    """The modules of each index backend's stores but the embedded default's (every row runs that
    one: exact search for dev scoring and mining), by ``index.backend``. Like a method package,
    a service backend's store is imported by every row (the store registry imports them all) and
    called only by rows that chose it: ``tests/benchmarks/test_provenance.py`` traces default runs."""
    from model_code.stores import _STORES, DEFAULT_BACKEND

    found: dict[str, set[str]] = {}
    for (backend, _), store in _STORES.items():
        if backend != DEFAULT_BACKEND:
            found.setdefault(backend, set()).add(store.__module__)
    return {backend: tuple(sorted(modules)) for backend, modules in found.items()}


def owners_run(harness: str, params: dict | None, varied: Iterable[str] = ()) -> frozenset[str] | None:
    """The kinds and methods (method packages, ``owner``) a row's runs used: the recorded params'
    ``retriever.kind`` and, when training ran, ``train.method`` (both sides of a sweep), and what the
    harness runs beside them. None (all count) without whole params, or when a sweep's grid ``varied`` the
    kind or the method (its dev variants ran others than the two sides it records)."""
    if params is None or RUN_SELECTORS & set(varied):
        return None
    sides = (params["winner"], params["baseline"]) if harness == "sweep" else (params,)
    used = set(HARNESS_RUNS.get(harness, ()))
    for side in sides:
        if not {"retriever", "train"} <= side.keys():
            return None  # not a whole resolved params record: nothing says what ran
        used.add(side["retriever"]["kind"])
        used.add(side.get("index", {}).get("backend", "faiss"))  # rows from before index.backend: FAISS
        if side["train"].get("enabled", True):
            used.add(side["train"]["method"])
    return frozenset(used)


def dependencies(harness: str, params: dict | None, root: Path = PROJECT, varied: Iterable[str] = (),
                 configs: Iterable[str] = ()) -> list[str]:
    """Project files a ``harness`` row with recorded ``params`` depends on (``varied``: a sweep's grid
    keys). Without ``params`` (or for a harness whose params are not compared) ``params.yaml`` counts,
    and for configuration runs the files of the row's ``configs`` (every configuration file when one
    of them is no longer defined: nothing then says which it was read from)."""
    used = owners_run(harness, params, varied)
    owners = {**owned_modules(root), **backend_modules()}
    unused = {module for owner, modules in owners.items() if used is not None and owner not in used
              for module in modules}
    depends = set(module_closure(harness_modules(harness, params), root, NOT_MEASURED | unused))
    if params is None or harness not in (*CONFIGURATION_HARNESSES, "freshness"):
        depends.add(PARAMS_FILE)
        if harness in CONFIGURATION_HARNESSES:
            depends.update(_config_files(configs, root))
    return sorted(depends)


def _config_files(configs: Iterable[str], root: Path) -> set[str]:
    """The configuration files (relative to ``root``) that ``configs`` are read from."""
    from benchmarks.configs import CONFIG_DIR, config_files

    directory = root / CONFIG_DIR.relative_to(PROJECT)
    found: set[Path] = set()
    for name in configs:
        files = config_files(name, directory)
        found.update(files if files is not None else directory.glob("*.yaml"))
    return {path.relative_to(root).as_posix() for path in found}


def row_configs(row: dict, harness: str) -> list[str]:
    """The configurations a row of a configuration harness ran: a sweep's base and baseline, a run's
    configuration (and, for ``shared_training``, the one whose model it searched)."""
    if harness == "sweep":
        return [row["base"], row["baseline"]]
    return [row["config"], *([row["trained_in"]] if "trained_in" in row else [])]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def changed_files(commit: str, root: Path = PROJECT) -> frozenset[str] | None:
    """Files that differ between ``commit`` and ``HEAD`` (both sides of a rename), or None when
    ``commit`` is not in the repository."""
    head = _git(root, "rev-parse", "HEAD").stdout.strip()
    return _diff(commit, head, root) if head else None


@cache
def _diff(commit: str, head: str, root: Path) -> frozenset[str] | None:
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return None
    diff = _git(root, "diff", "--name-only", "--no-renames", commit, head)
    if diff.returncode != 0:
        return None
    return frozenset(line for line in diff.stdout.splitlines() if line)


def code_commit(root: Path = PROJECT) -> str:
    """The latest commit that changed anything but results (archived ones too): what rows are judged
    against."""
    return _git(root, "log", "-1", "--format=%h", "--", ".", ":(exclude)benchmarks/results",
                ":(exclude)benchmarks/archive", ":(exclude)benchmarks/RESULTS.md").stdout.strip() or "unknown"


# params sections no compared harness reads: the endpoint's request limits and how often a serving
# process polls the registry change no number a pipeline run, a sweep or a freshness replay measures
NOT_MEASURED_SECTIONS = frozenset({"serve"})
# sections a harness never reads, beside those: a pipeline run, a sweep or shared training stops at the
# evaluation, so the freshness loop's settings (its drift thresholds, canary, copy cadence) change none of
# its numbers; the freshness harness compares them (``benchmarks.freshness.expected_params``)
UNREAD_SECTIONS = {"run": frozenset({"freshness"}), "shared_training": frozenset({"freshness"}),
                   "sweep": frozenset({"freshness"})}


def params_drift(now: dict | None, recorded: dict, unread: Iterable[str] = ()) -> list[str]:
    """Dotted params keys whose value resolves differently ``now`` than ``recorded`` (``data.path``,
    ``NOT_MEASURED_SECTIONS`` and the sections ``unread`` aside), or ``["config"]`` when there is
    nothing to resolve (a configuration that no longer exists or no longer validates). A setting
    added after the row was measured, at its default, is no difference: a new setting's default
    keeps what the code did before it existed."""
    if now is None:
        return ["config"]
    ignored = NOT_MEASURED_SECTIONS | set(unread)
    return sorted(key for key in _differences(recorded, now)
                  if key != "data.path" and key.split(".")[0] not in ignored
                  and not (_absent(recorded, key) and _is_default(key, _value(now, key))))


def _value(params: dict, key: str):
    for part in key.split("."):
        params = params.get(part) if isinstance(params, dict) else None
    return params


def _absent(params: dict, key: str) -> bool:
    """Whether ``params`` has no ``key`` at all (nor a section above it)."""
    *sections, last = key.split(".")
    for part in sections:
        if not isinstance(params, dict) or part not in params:
            return True
        params = params[part]
    return not isinstance(params, dict) or last not in params


def _is_default(key: str, value) -> bool:
    """Whether ``value`` is what ``Params`` gives setting ``key`` when params.yaml leaves it out."""
    from pydantic import BaseModel

    from model_code.config import Params

    model: type[BaseModel] = Params
    *sections, last = key.split(".")
    for part in sections:
        field = model.model_fields.get(part)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return False
        model = field.annotation
    field = model.model_fields.get(last)
    if field is None:
        return False
    default = field.get_default(call_default_factory=True)
    return (default.model_dump(mode="json") if isinstance(default, BaseModel) else default) == value


def _expected_params(row: dict, harness: str) -> list[tuple[dict | None, dict]]:
    """(the params a row's runs resolve to now, the params they recorded); None: its configuration
    no longer exists or no longer validates."""
    if harness == "freshness":
        from benchmarks.freshness import expected_params

        return expected_params(row)
    if harness in ("run", "shared_training"):
        from benchmarks.configs import PIPELINE_CONFIGS

        pairs = [(PIPELINE_CONFIGS.get(row["config"]), row["params"])]
    elif harness == "sweep":
        from benchmarks.sweep import expected_params

        pairs = expected_params(row)
    else:  # a harness whose params are not compared (incremental, clustering, svdr_index, index_cost)
        return []
    return [(_resolved(overrides, Path(recorded["data"]["path"])), recorded) for overrides, recorded in pairs]


def _resolved(overrides: dict | None, data_dir: Path) -> dict | None:
    """A configuration's params now, or None when it is gone or no longer validates (a setting it
    sets was removed or renamed since)."""
    from benchmarks.configs import resolve_params

    if overrides is None:
        return None
    try:
        return resolve_params(overrides, data_dir).model_dump(mode="json")
    except ValueError:
        return None


def changed_dependencies(commit: str, harness: str, params: dict | None, root: Path = PROJECT,
                         varied: Iterable[str] = (), configs: Iterable[str] = ()) -> list[str] | None:
    """Files a ``harness`` run depends on (``dependencies``) that changed between ``commit`` and
    ``HEAD`` (None: ``commit`` is not in the repository)."""
    root = root.resolve()
    changed = changed_files(commit, root)
    if changed is None:
        return None
    return sorted(changed & set(dependencies(harness, params, root, varied, configs)))


def _differences(a, b, prefix: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return {d for key in a.keys() | b.keys()
                for d in _differences(a.get(key), b.get(key), f"{prefix}{key}.")}
    return set() if a == b else {prefix.rstrip(".")}


def _listed(items: list[str], most: int = 3) -> str:
    return ", ".join(items[:most]) + (f", … ({len(items)} in all)" if len(items) > most else "")


def provenance(row: dict, harness: str, root: Path = PROJECT) -> str:
    """A short label: whether the row can be reproduced from its commit and whether what it
    depends on changed since ("**stale**"), naming the first files or params keys that did."""
    commit = row.get("commit")
    if not commit or commit == "unknown":
        return NO_COMMIT
    base = commit.removesuffix("+dirty")
    params = row.get("params")
    if harness == "freshness" and "overrides" not in row:
        params = None  # written before the harness recorded its overrides: params.yaml counts as a file
    configs = row_configs(row, harness) if harness in CONFIGURATION_HARNESSES else []
    files = changed_dependencies(base, harness, params, root, row.get("grid", {}), configs)
    if files is None:
        return f"commit {base} is not in this repository's history: not reproducible"
    labels = []
    if commit.endswith("+dirty") or row.get("dirty"):
        labels.append(f"dirty: uncommitted code at {base}, not reproducible")
    if files:
        labels.append(f"**stale**: {len(files)} file(s) it depends on changed since {base} ({_listed(files)})")
    if params is not None:
        unread = UNREAD_SECTIONS.get(harness, ())
        keys = sorted({key for now, recorded in _expected_params(row, harness)
                       for key in params_drift(now, recorded, unread)})
        if keys == ["config"]:
            labels.append("**stale**: its config is no longer defined (or no longer valid)")
        elif keys:
            labels.append(f"**stale**: its config now resolves to other params ({_listed([k for k in keys if k != 'config'])})")
    return "; ".join(labels) or f"current ({base})"
