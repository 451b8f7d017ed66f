"""One stage list drives the CLI, dvc.yaml and the Dagster assets; DVC's code dependencies follow
the imports; asset code versions follow params and code."""

import json
import subprocess
import sys

import yaml

from assets.pipeline import PIPELINE_ASSETS, SHARDED_ASSETS, params_version
from model_code.cli import PIPELINE
from model_code.config import Params
from model_code.stages.pipeline import PROJECT, STAGES, import_closure, render_dvc_yaml


def test_dvc_yaml_is_generated_from_the_stage_list():
    assert (PROJECT / "dvc.yaml").read_text() == render_dvc_yaml(), (
        "dvc.yaml is stale: python -m model_code.stages.pipeline > dvc.yaml")
    dvc = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]
    assert list(dvc) == [s.name for s in STAGES]
    assert list(PIPELINE) == [s.name for s in STAGES if s.command == "fresh-retriever"]
    assert [a.key.to_user_string() for a in PIPELINE_ASSETS + SHARDED_ASSETS] == (
        [s.asset for s in STAGES if not s.sharded] + [s.asset for s in STAGES if s.sharded])


# Run in one fresh interpreter: for each module, import it, list the project modules loaded, then
# forget every project module so the next import starts from none of them. Third-party packages stay
# loaded (they never import project code), which spares one torch import per stage.
PROJECT_IMPORTS = """
import json, pathlib, sys, importlib
root = pathlib.Path(sys.argv[1])
def project_modules():
    return [m for m in list(sys.modules.values()) if getattr(m, "__file__", None)
            and m.__name__.split(".")[0] in ("model_code", "tracking")
            and pathlib.Path(m.__file__).resolve().is_relative_to(root / m.__name__.split(".")[0])]
loaded = {}
for module in sys.argv[2:]:
    importlib.import_module(module)
    loaded[module] = sorted(str(pathlib.Path(m.__file__).resolve().relative_to(root)) for m in project_modules())
    for m in project_modules():
        del sys.modules[m.__name__]
print(json.dumps(loaded))
"""


def imported_project_files(*modules: str) -> dict[str, set[str]]:
    """What importing each of ``modules`` on its own really loads from the project."""
    out = subprocess.run([sys.executable, "-c", PROJECT_IMPORTS, str(PROJECT), *modules], cwd=PROJECT,
                         capture_output=True, text=True, check=True)
    return {module: set(files) for module, files in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def test_each_stage_depends_on_exactly_the_code_it_imports():
    imported = imported_project_files(*(current.module for current in STAGES))
    for current in STAGES:
        closure = {str(p) for p in import_closure(current.module)}
        assert closure == imported[current.module], current.name
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
