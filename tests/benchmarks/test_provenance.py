"""``benchmarks.provenance`` claims that a module of one method package (``model_code/methods/<name>/``,
owned by the retriever kind or training method ``<name>``) is never called by a run of another, which is
what lets a row stay current when only another method's files changed. Checked by tracing: a tiny
pipeline run of every kind and method under a tracer records every project module whose code runs;
none may lie outside the row's dependencies, and each run must call every module of its kind's and
method's packages that has code to call (no package holds a dead or shared module)."""

import importlib
import pkgutil
from pathlib import Path
from typing import get_args

import coverage
import pytest

import model_code
from benchmarks import provenance
from benchmarks.configs import PIPELINE_CONFIGS, resolve_params
from benchmarks.run import METRICS, run_params
from model_code.config import TrainParams
from model_code.retrievers import kind_names
from tests.conftest import tiny_params

RUNS = {
    "dense-mined": {"train": {"hard_negatives": 1, "mining": {"source": "bm25", "depth": 10}}},
    "hce": {"train": {"method": "hce", "hce": {"mode": "J", "rounds": 2}}},
    "mlr-scalar-mix": {"retriever": {"kind": "mlr", "mlr": {"layers": [2, 1], "pooling": "scalar_mix"}}},
    "svdr-rerank": {"retriever": {"kind": "svdr", "svdr": {"search": "beta_rerank", "rerank_depth": 5,
                                                           "retrieved_negatives": 1}}},
    "incdsi": {"retriever": {"kind": "incdsi", "incdsi": {"tune_trials": 2, "tune_share": 0.2}}},
}


def owned_files(owners) -> set[str]:
    owned = provenance.owned_modules()
    return {provenance._module_file(provenance.PROJECT, module).relative_to(provenance.PROJECT).as_posix()
            for owner in owners for module in owned[owner]}


def compiled(file: str) -> bool:
    """Whether the module holds numba-compiled functions: the run calls their machine code, where
    no tracer sees a line of it run (IncDSI's optimiser; its caller, the head, is traced)."""
    module = importlib.import_module(file.removesuffix(".py").replace("/", "."))
    return any(getattr(getattr(value, "py_func", None), "__module__", None) == module.__name__
               for value in vars(module).values())


def callable_files(owners) -> set[str]:
    """``owners``' files that a run calls in Python: not a package's docstring (``__init__.py``), its
    settings model (``settings.py``: validated when the params are read, before the run) nor its
    compiled code."""
    return {file for file in owned_files(owners)
            if Path(file).name not in ("__init__.py", "settings.py") and not compiled(file)}


def test_every_method_package_is_named_by_a_kind_or_a_training_method():
    methods = set(get_args(TrainParams.model_fields["method"].annotation))
    assert set(provenance.owned_modules()) <= set(kind_names()) | methods
    assert {"svdr", "mlr", "incdsi", "hce"} <= set(provenance.owned_modules())
    assert provenance.owner("model_code.methods.svdr.retriever") == "svdr" == provenance.owner("model_code.methods.svdr")
    assert provenance.owner("model_code.methods") is None and provenance.owner("model_code.retrievers.dense") is None


def traced_run(params, workdir: Path) -> set[str]:
    """Project files (relative paths) in which ``run_params`` runs a line. Every project module is
    imported first, so that what is recorded is calls, not the definitions an import runs (coverage's
    C tracer: a Python profile hook slows the pipeline's validation code several times over)."""
    for module in pkgutil.walk_packages(model_code.__path__, "model_code."):
        importlib.import_module(module.name)
    tracer = coverage.Coverage(data_file=None, source=[str(provenance.PROJECT / "model_code")])
    tracer.start()
    try:
        run_params(params, workdir)
    finally:
        tracer.stop()
    return {Path(f).relative_to(provenance.PROJECT).as_posix() for f in tracer.get_data().measured_files()
            if tracer.get_data().lines(f)}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_calls_the_modules_its_kind_owns_and_none_it_does_not_depend_on(name, tmp_path, beir_dir,
                                                                              tiny_model_dir):
    overrides = tiny_params(beir_dir, tiny_model_dir, eval={"metrics": METRICS, "top_k": 100})
    for section, values in RUNS[name].items():
        overrides[section] = {**overrides[section], **values}
    params = resolve_params(overrides, beir_dir)
    recorded = params.model_dump(mode="json")
    called = {f for f in traced_run(params, tmp_path) if f.startswith("model_code/")}
    depends = set(provenance.dependencies("run", recorded))

    assert called - depends == set()
    used = provenance.owners_run("run", recorded)
    assert callable_files(used & provenance.owned_modules().keys()) <= called
    others = provenance.owned_modules().keys() - used
    assert others and not owned_files(others) & depends  # what ownership buys: other methods' files do not count


def test_rows_depend_on_the_modules_of_the_kinds_and_methods_they_ran(tmp_path):
    def depends(config, harness="run", **row):
        params = resolve_params(PIPELINE_CONFIGS[config], tmp_path).model_dump(mode="json")
        return set(provenance.dependencies(harness, row.get("params", params), varied=row.get("varied", ())))

    svdr, training_hce = "model_code/methods/svdr/retriever.py", "model_code/methods/hce/training.py"
    assert svdr not in depends("ct-hn") and training_hce not in depends("ct-hn")
    assert svdr in depends("svdr-beta") and training_hce in depends("hce-j-long")
    assert "model_code/methods/incdsi/head.py" in depends("ct-hn", "incremental")  # the harness adds IncDSI
    hce = resolve_params(PIPELINE_CONFIGS["hce-j-long"], tmp_path).model_dump(mode="json")
    mlr = resolve_params(PIPELINE_CONFIGS["mlr-sc"], tmp_path).model_dump(mode="json")
    sweep = depends("ct-hn", "sweep", params={"winner": mlr, "baseline": hce})
    assert {"model_code/methods/mlr/retriever.py", training_hce} <= sweep and svdr not in sweep
    assert svdr in depends("ct-hn", "sweep", params={"winner": mlr, "baseline": hce}, varied=["retriever.kind"])
    assert svdr in set(provenance.dependencies("run", None))  # nothing recorded: everything counts
    assert provenance.owners_run("svdr_index", {}) is None  # a partial record says nothing of what ran
    assert "benchmarks/shared_training.py" in depends("svdr-beta", "shared_training")
    milvus = "model_code/stores/milvus_store.py"  # the milvus backend's stores: rows that chose it only
    assert provenance.backend_modules() == {"milvus": ("model_code.stores.milvus_store",)}
    assert milvus not in depends("ct-hn") and "model_code/stores/faiss_store.py" in depends("ct-hn")
    on_milvus = resolve_params({**PIPELINE_CONFIGS["ct-hn"], "index": {"backend": "milvus"}}, tmp_path)
    assert milvus in depends("ct-hn", params=on_milvus.model_dump(mode="json"))
    assert milvus in depends("ct-hn", "sweep", params={"winner": mlr, "baseline": hce}, varied=["index.backend"])
