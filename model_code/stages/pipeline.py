"""The pipeline's stages, listed once. The CLI (``fresh-retriever <stage>``), ``dvc.yaml`` and the
Dagster assets are all made from this list, so a stage is added or changed here and nowhere else.

Each stage names the module whose ``run(params, layout) -> summary`` it calls, the params sections
it reads, what it reads and writes (``Layout`` attributes), and how DVC should treat its outputs.
DVC's code dependencies are not written by hand: they are the project files the stage's module
imports, directly or not (``import_closure``), so a change to any of them re-runs the stage. A
stage that hands work to the retriever kinds (training asks each kind for its recipe) names the
kinds' hook (``kind_hook``): the modules every registered kind's hook returns, with what they
import, join its code, and the settings section of each kind with a hook of its own joins its
params; so a kind brings its training without an edit here.

``dvc.yaml`` is generated: ``python -m model_code.stages.pipeline > dvc.yaml`` (a test fails when it
is out of date).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from model_code.config import Params
from model_code.layout import Layout

PROJECT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("model_code", "tracking")


@dataclass(frozen=True)
class Stage:
    name: str  # CLI subcommand and DVC stage
    asset: str  # Dagster asset
    module: str  # defines run(params, layout) -> dict
    group: str  # Dagster asset group
    description: str
    sections: tuple[str, ...]  # params.yaml sections (or section.key) it reads
    reads: tuple[str, ...] = ()  # Layout attributes (paths) it reads
    writes: tuple[str, ...] = ()  # Layout attributes (paths) it writes; the first is its main output
    command: str = "fresh-retriever"
    moves_champion: bool = False  # may change what is deployed: one such step at a time (Dagster pool)
    dvc: dict = field(default_factory=dict)  # written path -> {"cache": False} or its files' DVC roles (FILES)
    kind_hook: str | None = None  # a Retriever classmethod returning the class a kind does this stage's work with
    sharded: bool = False  # runs per shard of data.shards: run(params, layout, shard), a partitioned asset, DVC foreach
    wants_gpu: bool = False  # a deployment that schedules steps (Kubernetes) gives this one a GPU

    def runner(self) -> Callable[[Params, Layout], dict]:
        return importlib.import_module(self.module).run

    def params_sections(self) -> tuple[str, ...]:
        """``sections``, and ``retriever.<kind>`` of each kind whose hook differs from the base's."""
        return self.sections + tuple(f"retriever.{name}" for name in _hooked_kinds(self.kind_hook))


def _hooked_kinds(hook: str | None) -> list[str]:
    """Kinds with settings whose ``hook`` returns a class of their own (they read their section)."""
    if hook is None:
        return []
    from model_code.retrievers import kind_class, kind_names
    from model_code.retrievers.base import Retriever

    default = getattr(Retriever, hook)()
    return [name for name in kind_names()
            if kind_class(name).settings_model is not None and getattr(kind_class(name), hook)() is not default]


def code_files(current: Stage) -> list[Path]:
    """The project files ``current`` runs: its module's import closure and, with a ``kind_hook``,
    that of the module every registered kind's hook returns a class from."""
    files = set(import_closure(current.module))
    if current.kind_hook is not None:
        from model_code.retrievers import kind_class, kind_names

        for name in kind_names():
            files |= set(import_closure(getattr(kind_class(name), current.kind_hook)().__module__))
    return sorted(files)


UNCACHED = {"cache": False}
# a report directory's files by DVC role: out (cached), log (uncached out), metrics, or a plot (x, y)
TRAIN_FILES = {"files": {"metrics.json": "metrics", "steps.csv": ("step", "loss")}}
EVAL_FILES = {"files": {"run.trec": "out", "per_query.csv": "log", "metrics.json": "metrics",
                        "recall_curve.json": ("k", "recall"), "metrics.png": (None, None)}}
STAGES: tuple[Stage, ...] = (
    Stage("ingest", "corpus", "model_code.stages.ingest", "data",
          "Validated corpus, queries, qrels per split and the old/new/tune split.",
          ("data",), writes=("ingested", "ingest_report"), dvc={"ingest_report": UNCACHED}),
    Stage("querygen", "pseudo_queries", "model_code.stages.querygen", "data",
          "Inverse-cloze pseudo-queries for training and generated queries per document.",
          ("querygen",), reads=("ingested",), writes=("pseudo_queries", "generated_queries")),
    Stage("mine-negatives", "hard_negatives", "model_code.stages.mine", "data",
          "Hard negatives per train query: BM25 and/or dense top-k without the query's relevant documents.",
          ("train.hard_negatives", "train.mining", "encoder", "retriever.kind"), reads=("ingested",),
          writes=("hard_negatives",)),
    Stage("cluster", "corpus_tree", "model_code.stages.hierarchy", "model",
          "Corpus tree by recursive spherical k-means over the base encoder's vectors.",
          ("hierarchy", "encoder", "retriever.kind"), reads=("ingested",), writes=("hierarchy",)),
    Stage("train", "encoder", "model_code.stages.train", "model",
          "Fine-tuned encoder (Hugging Face and sentence-transformers directory).",
          ("encoder", "hierarchy", "train", "retriever.kind", "eval.ignore_identical_ids"),
          reads=("ingested", "pseudo_queries", "hard_negatives", "hierarchy"),
          writes=("encoder", "final_tree", "train_report"),
          dvc={"train_report": TRAIN_FILES}, kind_hook="training_recipe", wants_gpu=True),
    Stage("encode-corpus", "corpus_shards", "model_code.stages.encode_corpus", "model",
          "The corpus encoded as the retriever.kind's build encodes it, into the embedding cache, one shard of "
          "data.shards per run: the index stage reads the vectors instead of encoding.",
          ("data.shards", "encoder", "retriever"), reads=("ingested", "encoder"), writes=("shard_reports",),
          dvc={"shard_reports": UNCACHED}, sharded=True),
    Stage("index", "retriever_index", "model_code.stages.index", "model",
          "The retriever.kind retriever built over the corpus (manifest.json names its kind and files).",
          ("encoder", "index", "retriever"), reads=("ingested", "generated_queries", "encoder", "shard_reports"),
          writes=("retriever",)),
    Stage("evaluate", "evaluation", "model_code.stages.evaluate", "evaluation",
          "Retrieval metrics (trec_eval's, via pytrec_eval) of the built retriever on eval.split.",
          ("eval", "retriever.kind"), reads=("ingested", "retriever", "encoder"), writes=("eval_report",),
          dvc={"eval_report": EVAL_FILES}),
    Stage("register", "registered_model", "tracking.registry", "evaluation",
          "MLflow run with the reports, and the retriever registered as a pyfunc model (champion or challenger).",
          ("registry", "eval", "serve"), reads=("ingested", "encoder", "retriever", "eval_report/metrics.json"),
          writes=("registry_report",), command="fresh-registry", dvc={"registry_report": UNCACHED},
          moves_champion=True),
)
def upstream(current: Stage) -> list[Stage]:
    """The stages writing what ``current`` reads."""
    read = {path.split("/")[0] for path in current.reads}
    return [other for other in STAGES if set(other.writes) & read and other is not current]


def _module_file(module: str) -> Path | None:
    base = PROJECT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(file: Path, module: str) -> frozenset[str]:
    """Project modules imported at module level by ``file`` (imports inside functions are
    lazy and deliberately not followed: see ``retrievers.registry``)."""
    stat = file.stat()
    return _parsed_imports(file, module, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parsed_imports(file: Path, module: str, mtime_ns: int, size: int) -> frozenset[str]:
    """``_imports`` once per version of a file: every stage's closure shares most files, and
    parsing them again for each stage made loading the Dagster definitions (which every run
    worker does) about a second slower. The modification time and size in the key keep an edited
    file from being answered from the cache."""
    found: set[str] = set()
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT_PACKAGES:
                found.add(name)
    return frozenset(found)


def import_closure(module: str) -> list[Path]:
    """Every project file ``module`` imports at module level, directly or through others
    (package ``__init__`` files included), as paths relative to the project."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            prefix = ".".join(parts[:depth])
            file = _module_file(prefix)
            if file is not None and prefix not in seen:
                seen[prefix] = file
                todo.extend(_imports(file, prefix))
    return sorted({file.relative_to(PROJECT) for file in seen.values()})


def code_hash(current: Stage) -> str:
    """Content hash of the stage's import closure (its Dagster code version)."""
    digest = hashlib.sha256()
    for path in code_files(current):
        digest.update(str(path).encode())
        digest.update((PROJECT / path).read_bytes())
    return digest.hexdigest()[:12]


def _relative(layout: Layout, path: str) -> str:
    """``attribute`` or ``attribute/file`` of ``Layout`` as a path relative to the workspace."""
    attribute, _, file = path.partition("/")
    return str((getattr(layout, attribute) / file).relative_to(layout.root)).removesuffix("/.")


def shard_count() -> int:
    """``data.shards`` of the project's params.yaml (1 when it cannot be read): how many shard
    stages ``dvc.yaml`` lists (``encode_corpus.parse_shard`` refuses a mismatch at run time)."""
    try:
        return int((yaml.safe_load((PROJECT / "params.yaml").read_text()) or {}).get("data", {}).get("shards", 1))
    except (OSError, yaml.YAMLError, AttributeError):
        return 1


def _dependencies(layout: Layout, current: Stage, shards: int) -> list[str]:
    """What DVC watches for ``current``: its inputs (each shard's report of a sharded stage's
    output) and every project file its module imports."""
    paths = []
    for attribute in current.reads:
        writer = next((other for other in STAGES if attribute in other.writes), None)
        if writer is not None and writer.sharded:
            paths += [f"{_relative(layout, attribute)}/{i}.json" for i in range(shards)]
        else:
            paths.append(_relative(layout, attribute))
    return paths + [str(p) for p in code_files(current)]


def dvc_stages() -> dict:
    """``dvc.yaml``'s content."""
    layout, shards = Layout("/"), shard_count()
    stages = {}
    for current in STAGES:
        outs, metrics, plots = [], [], []
        for attribute in current.writes:
            path, options = _relative(layout, attribute), current.dvc.get(attribute, {})
            for file, role in options.get("files", {}).items():
                name = f"{path}/{file}"
                if role == "metrics":
                    metrics.append({name: {"cache": False}})
                elif isinstance(role, tuple):
                    plots.append({name: {"cache": False, **({"x": role[0], "y": role[1]} if role[0] else {})}})
                else:
                    outs.append(name if role == "out" else {name: {"cache": False}})
            if "files" not in options:
                outs.append({path: {"cache": False}} if options.get("cache") is False else path)
        entry = {
            "cmd": f"{current.command} {current.name}",
            "deps": _dependencies(layout, current, shards),
            "params": list(current.params_sections()),
        }
        entry.update({key: value for key, value in (("outs", outs), ("metrics", metrics), ("plots", plots)) if value})
        if current.sharded:  # one stage per shard: encode-corpus@0, @1, ... each with its own report
            entry["cmd"] += f" --shard ${{item}}/{shards}"
            entry["outs"] = [{f"{_relative(layout, current.writes[0])}/${{item}}.json": {"cache": False}}]
            entry = {"foreach": list(range(shards)), "do": entry}
        stages[current.name] = entry
    return {"stages": stages}


HEADER = """\
# GENERATED from model_code/stages/pipeline.py: python -m model_code.stages.pipeline > dvc.yaml
# The same stages as the Dagster asset graph and the fresh-retriever CLI. deps: the stage's inputs
# and every project file its module imports (DVC does not follow Python imports by itself).
"""


def render_dvc_yaml() -> str:
    return HEADER + yaml.safe_dump(dvc_stages(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render_dvc_yaml())
