"""One stage list drives the CLI, dvc.yaml and the Dagster assets; DVC's code dependencies follow
the imports; asset code versions follow params and code."""

import json
import subprocess
import sys

import yaml

from assets.pipeline import PIPELINE_ASSETS, params_version
from model_code.cli import PIPELINE
from model_code.config import Params
from model_code.stages.pipeline import PROJECT, STAGES, import_closure, render_dvc_yaml


def test_dvc_yaml_is_generated_from_the_stage_list():
    assert (PROJECT / "dvc.yaml").read_text() == render_dvc_yaml(), (
        "dvc.yaml is stale: python -m model_code.stages.pipeline > dvc.yaml")
    dvc = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]
    assert list(dvc) == [s.name for s in STAGES]
    assert list(PIPELINE) == [s.name for s in STAGES if s.command == "fresh-retriever"]
    assert [a.key.to_user_string() for a in PIPELINE_ASSETS] == [s.asset for s in STAGES]


def imported_project_files(module: str) -> set[str]:
    """What importing ``module`` really loads from the project, in a fresh interpreter."""
    code = (f"import sys, json, pathlib; import {module}; root = pathlib.Path({str(PROJECT)!r}); "
            "print(json.dumps(sorted(str(pathlib.Path(m.__file__).resolve().relative_to(root)) for m in "
            "list(sys.modules.values()) if getattr(m, '__file__', None) and "
            "pathlib.Path(m.__file__).resolve().is_relative_to(root / m.__name__.split('.')[0]) and "
            "m.__name__.split('.')[0] in ('model_code', 'tracking'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_each_stage_depends_on_exactly_the_code_it_imports():
    for current in STAGES:
        closure = {str(p) for p in import_closure(current.module)}
        assert closure == imported_project_files(current.module), current.name
    index_deps = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]["index"]["deps"]
    assert {"model_code/models/encoder.py", "model_code/retrievers/dense.py"} <= set(index_deps)
    assert "model_code/models/encoder.py" in yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]["evaluate"]["deps"]


def stage(name: str):
    return next(s for s in STAGES if s.name == name)


def test_asset_code_versions_follow_the_params_each_stage_reads():
    base = Params()
    other_train = Params(train={"max_steps": 7})
    assert params_version(base, stage("train")) != params_version(other_train, stage("train"))
    assert params_version(base, stage("index")) == params_version(other_train, stage("index"))
    assert params_version(base, stage("evaluate")) != params_version(Params(retriever={"kind": "bm25"}), stage("evaluate"))


def test_the_served_model_lists_every_library_its_code_imports():
    """``mlflow models serve`` with a virtualenv installs PIP_REQUIREMENTS only: every third-party
    package the pyfunc's code imports (its import closure, read from the source) must be there."""
    import ast
    import importlib.metadata
    import re

    from tracking.pyfunc import PIP_REQUIREMENTS

    listed = {re.split(r"[=<>]", r)[0].lower().replace("_", "-") for r in PIP_REQUIREMENTS}
    distributions = importlib.metadata.packages_distributions()
    missing = set()
    for path in import_closure("tracking.pyfunc_entry"):
        for node in ast.parse((PROJECT / path).read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("model_code", "tracking", "__future__"):
                    continue
                providers = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
                if not providers & listed:  # e.g. mlflow is provided by mlflow, mlflow-skinny, ...
                    missing.add(f"{top} ({', '.join(sorted(providers))})")
    assert not missing, f"PIP_REQUIREMENTS lacks {sorted(missing)}"
