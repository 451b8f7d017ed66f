"""``make mutation``: mutmut over the modules that hold the methods' mathematics, against their fast
unit tests only, in a scratch copy of the committed tree (the checkout is never touched).

    .venv/bin/python tests/mutation/run.py [--modules PATH ...] [--max-children 2] [--keep]
    .venv/bin/python tests/mutation/run.py --make     # what `make mutation` runs: the deliberate
                                                      # errors, then the modules that changed; timed
    .venv/bin/python tests/mutation/run.py --make --all   # `make mutation-full`: every module

The modules asked for are mutated in one mutmut run whose test selection is the union of their
``MODULE_TESTS`` files; mutmut then runs each mutant against only the selected tests that call the
mutated function (it records which while running the selection once), fastest first, stopping at
the first failure. Two records are kept, so that what is committed stays readable:

* ``tests/mutation/summary.json`` (committed): per module its counts (mutants, killed, survivors
  explained as equivalent by ``survivors.py``), the survivors not explained (with their diffs: the
  gaps), the killer checks that failed, the commit measured and its fingerprint; the runs that
  measured what it holds, and ``make mutation``'s timings;
* ``tests/mutation/out/`` (git-ignored): ``results.json``, every mutant of the modules measured on
  this machine (module, function, status and, for survivors, the diff), the killer checks and the
  runs' test selections, and ``REPORT.md``, the report with every survivor and killer check.

After a run its results replace those modules' in both, so ``--modules`` re-runs some modules and
keeps the others' results. Then ``REPORT.md`` (the summary's report) is written (``report.py``).

Incremental runs: with a module's results run.py records its fingerprint in ``summary.json``
(the commit, the sha256 of the module's source and of each file of its ``MODULE_TESTS`` selection,
a ``file::test`` id hashing its file), taken from the committed tree that was mutated. ``--make``
re-mutates only the modules whose fingerprint differs from HEAD's files (source changed, tests or
test selection changed, or never run) and keeps the others' results; ``--make --all`` re-mutates
every module. ``--survivors-of`` re-tests survivors only and leaves the fingerprint as it was (the
module's killed mutants were not re-measured); it needs the module's full results in ``out/``. Not
covered by the fingerprint: this script, the conftest.py files and ``tests/helpers/`` (what the
selected files import), the installed packages, and a test of another module's selection that
killed a mutant when modules ran together (mutmut runs each mutant against every test of the run's
union that calls the mutated function); ``make mutation-full`` re-measures all of it.

Speed (the kill check is unchanged: the same tests decide every mutant): pytest's
unraisable-exception plugin runs a full ``gc.collect()`` at the end of every pytest session, about
1 s per mutant in a process holding torch and transformers; it is disabled (``-p
no:unraisableexception``: an unraisable exception is a warning there, never a failure, unless
warnings are errors, which they are not here). The fork server freezes its objects for the garbage
collector after warm-up, so that collections inside each mutant's process skip them. One mutmut run
for all the modules pays its fixed costs (listing, tracing the tests once, the clean and forced-fail
runs) once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
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
SUMMARY = HERE / "summary.json"
OUT = HERE / "out"
RESULTS = OUT / "results.json"

# module -> the fast unit-test files run against its mutants (no training, pipeline or CLI tests);
# a run over several modules selects the union of their files
# (a file::test id selects that test alone where the rest of its file trains models or runs stages, or
# tests what the module's selection never covered: a selection stays what it was when the files moved)
T = "tests/model_code/"
HCE, INCDSI, MLR, SVDR = (f"{T}methods/{name}/" for name in ("hce", "incdsi", "mlr", "svdr"))
TREE = T + "hierarchy/test_tree.py"


def tests_of(path: str, *names: str) -> list[str]:
    return [f"{path}::{name}" for name in names]


# the pure building blocks: ICT spans, the corpus tree, the in-batch loss, the FAISS store, metrics, splits
COMPONENTS = [T + "stages/test_querygen.py", T + "losses/test_contrastive.py", T + "data/test_splits.py",
              *tests_of(T + "eval/test_metrics.py", "test_metrics_perfect_partial_and_missing_queries"),
              *tests_of(T + "stores/test_faiss_store.py", "test_index_factories_find_each_document_itself",
                        "test_invalid_factory_is_a_clear_error", "test_incremental_add_and_remove_equal_a_rebuild")]
COMPONENT_TREE = tests_of(TREE, "test_tree_paths_are_consistent", "test_auto_branching_is_the_papers_rule",
                          "test_tree_round_trips", "test_tree_invariants")
# HCE against the paper (Eq. 5, 6, 8, the objective, Alg. 1's tree), HCE's loss, and the building blocks
HCE_FAST = [HCE + "test_loss.py", HCE + "test_objective.py", *COMPONENTS, *COMPONENT_TREE,
            *tests_of(TREE, "test_clusters_per_level_are_ceil_n_over_b_to_the_i", "test_tree_stats_by_hand",
                      "test_agglomerative_tree_is_algorithm_1_step_by_step",
                      "test_identical_documents_give_a_tree_without_cluster_levels",
                      "test_divisive_tree_is_top_down_k_means_step_by_step")]
HCE_TESTS = [*HCE_FAST,
             # hard negatives and MLR's objective (losses and objectives by hand; model code since the HCE run)
             *tests_of(T + "training/test_negatives.py", "test_the_loss_with_hard_negatives_equals_a_hand_computation",
                       "test_draws_pad_short_pools_and_never_draw_a_rows_own_positive",
                       "test_hce_levels_score_the_hard_negatives",
                       "test_pseudo_query_training_takes_no_hard_negatives"),
             *tests_of(MLR + "test_training.py", "test_each_poolings_loss_equals_a_hand_computation",
                       "test_scalar_mix_weights_get_gradients_and_start_as_mean_pooling"),
             T + "training/test_objectives.py"]
# IncDSI's head against the paper, its additions, its training, and the tuning checks written with them (the
# tuning loop's own file, the rest of test_tuning.py, is tuning.py's)
INCDSI_TUNING = tests_of(INCDSI + "test_tuning.py", "test_f_beta_weighs_old_documents",
                         "test_held_out_queries_are_half_the_natural_ones_else_one_generated_per_document",
                         "test_simulation_leaves_the_additions_out_of_the_head_and_scores_only_held_out_queries",
                         "test_tuning_loop_runs_trials_and_returns_parameters_in_range",
                         "test_constrained_objective_keeps_the_best_new_score_within_the_allowed_old_drop",
                         "test_constrained_tuning_reports_each_trials_drop",
                         "test_tuning_scores_trials_with_f_beta_of_new_and_old_and_keeps_the_best",
                         "test_best_trial_is_the_highest_f_beta")
INCDSI_TESTS = [INCDSI + "test_head.py", INCDSI + "test_head_training.py", *INCDSI_TUNING]
# SVDR's hand computations and brute-force checks: the encoder against the formula in NumPy, bags of tokens
# against per-document token sets, the index and every search mode against dense products, each loss term and
# the objective against a NumPy loss (not: the pipeline, registry, Dagster and benchmark tests of the kind)
SVDR_TESTS = [
    *tests_of(SVDR + "test_model.py", "test_encoder_is_elu1p_of_the_tied_projection_max_pooled_over_real_tokens",
              "test_encode_keeps_the_top_k_or_the_texts_own_tokens", "test_bag_of_tokens_by_hand_on_a_tiny_vocabulary",
              "test_sparsify_by_hand", "test_the_projection_is_tied_and_the_passage_side_can_be_separate",
              "test_a_saved_encoder_loads_with_its_layernorms_and_passage_side",
              # the tests written for the survivors of the first SVDR run
              "test_one_model_encodes_both_sides_by_default",
              "test_a_saved_shared_encoder_is_one_model_again_with_its_layernorm",
              "test_encode_cuts_texts_at_max_length_tokens", "test_encode_of_no_texts_and_the_training_mode_it_leaves",
              "test_a_vocab_start_must_leave_a_dimension",
              "test_the_hub_is_asked_only_online_and_only_for_a_name_that_is_no_directory",
              "test_a_separate_passage_side_is_not_downloaded_either", "test_the_default_side_is_the_query_side"),
    SVDR + "test_token_bags.py", T + "stores/test_csr_store.py",
    *tests_of(SVDR + "test_retriever.py", "test_each_search_mode_scores_its_matrix_product",
              "test_beta_rerank_rescores_the_top_m_and_keeps_the_rest_in_beta_order", "test_rerank_by_hand",
              "test_a_beta_addition_appends_token_rows_without_loading_the_model",
              "test_a_delta_replays_onto_its_base_as_the_update_left_it",
              # the tests written for the survivors of the first SVDR run
              "test_build_indexes_the_corpus_tokens_and_reports_from_the_clock",
              "test_build_of_the_parametric_index_holds_the_pure_top_k_passage_vectors",
              "test_add_reports_milliseconds_per_document_from_the_clock",
              "test_a_saved_retriever_loads_with_its_settings_lengths_and_build_facts", "test_svdr_uses_no_corpus_tree",
              "test_the_handle_loads_its_own_directory_without_the_hub",
              "test_the_handle_loads_the_encoder_its_settings_describe",
              "test_the_handle_embeds_queries_with_the_query_side_and_cuts_tokens_at_each_sides_length",
              "test_passages_that_rescore_equal_keep_their_beta_order"),
    *tests_of(SVDR + "test_loss.py", "test_symmetric_nll_by_hand", "test_each_term_of_the_semi_parametric_loss",
              "test_the_loss_with_hard_negatives_known_positives_and_one_ranks_rows"),
    *tests_of(SVDR + "test_training.py",
              "test_the_training_objective_is_the_loss_of_the_encoded_batch_and_its_hard_negatives",
              "test_the_objective_on_rank_1_of_2_scores_its_rows_of_texts_cut_at_their_lengths")]
# MLR's representations by hand: each text's layer vectors of a padded batch against transformers one text
# at a time, the poolings' losses, the scalar mix's gradients, the untied sides' gradient routing, and the
# retriever against brute force (not the training and pipeline tests of the same files)
MLR_TESTS = [*tests_of(MLR + "test_kind.py", "test_layer_vectors_of_a_padded_batch_are_each_texts_own"),
             *tests_of(MLR + "test_training.py", "test_each_poolings_loss_equals_a_hand_computation",
                       "test_scalar_mix_weights_get_gradients_and_start_as_mean_pooling"),
             *tests_of(T + "models/test_untied_encoder.py", "test_each_side_gets_the_gradient_of_its_own_texts_only",
                       "test_hce_and_mlr_objectives_encode_queries_with_the_query_side",
                       "test_untied_mlr_scores_query_side_vectors_against_passage_side_layers",
                       "test_an_untied_retriever_encodes_queries_and_documents_each_with_its_side",
                       "test_the_tied_default_saves_and_encodes_as_before"),
             MLR + "test_retriever.py",
             # the encoder against transformers by hand, sentence-transformers and torch; the mix's file
             T + "models/test_encoder.py", MLR + "test_layer_mix.py"]
# training pairs and their batches, and the seeds' draws of mined and retrieved negatives
TRAINING_PAIRS = [T + "training/test_pairs.py", *tests_of(T + "training/test_negatives.py",
                                                          "test_mined_draws_are_the_seeds",
                                                          "test_retrieved_draws_are_the_seeds")]
# the draws of mined and retrieved negatives (pools, padding, a row's own positive never drawn, the seed's draws)
NEGATIVES_TESTS = [*HCE_TESTS, *TRAINING_PAIRS, *tests_of(
    SVDR + "test_training.py", "test_draws_are_distinct_pool_members_and_every_member_is_drawn_in_time",
    "test_a_pool_smaller_than_the_count_pads_with_the_rows_positive_excluded",
    "test_the_objective_scores_the_retrieved_negatives_after_any_mined_ones",
    "test_more_draws_than_the_pool_holds_are_refused")]
OBJECTIVE_TESTS = [*HCE_TESTS, *tests_of(T + "models/test_untied_encoder.py",
                                         "test_each_side_gets_the_gradient_of_its_own_texts_only",
                                         "test_hce_and_mlr_objectives_encode_queries_with_the_query_side")]
MODULE_TESTS = {
    "model_code/methods/incdsi/head.py": INCDSI_TESTS,
    "model_code/methods/incdsi/tuning.py": [INCDSI + "test_tuning.py", INCDSI + "test_head.py",
                                            INCDSI + "test_head_training.py"],
    "model_code/eval/metrics.py": [T + "eval/test_metrics.py", *[t for t in COMPONENTS if "test_metrics.py" not in t],
                                   *COMPONENT_TREE, INCDSI + "test_head_training.py",
                                   *INCDSI_TUNING[:6]],  # the tuning checks written in the head's training file
    "model_code/losses/contrastive.py": HCE_TESTS,
    "model_code/methods/hce/loss.py": HCE_TESTS,
    "model_code/hierarchy/tree.py": [*[t for t in HCE_FAST if not t.startswith(TREE)], TREE],
    # the untied query encoder's gradient routing through the objectives, by hand on two model copies
    "model_code/training/objectives.py": OBJECTIVE_TESTS,
    "model_code/methods/hce/objective.py": OBJECTIVE_TESTS,
    "model_code/methods/mlr/objective.py": OBJECTIVE_TESTS,
    "model_code/methods/mlr/retriever.py": [MLR + "test_retriever.py"],
    "model_code/methods/svdr/loss.py": SVDR_TESTS,
    # and the token ids sent to the model's device (the meta device standing in for a GPU)
    "model_code/methods/svdr/model.py": [*SVDR_TESTS, *tests_of(T + "models/test_encoder.py",
                                                                "test_tokenized_batches_go_to_the_encoders_device")],
    "model_code/methods/svdr/token_bags.py": SVDR_TESTS,
    "model_code/stores/csr_store.py": SVDR_TESTS,
    "model_code/methods/svdr/retriever.py": SVDR_TESTS,
    # in-training negative retrieval against brute force and a NumPy loss (not the train-stage test)
    "model_code/methods/svdr/training.py": [*SVDR_TESTS, *tests_of(
        SVDR + "test_training.py", "test_pools_are_the_brute_force_top_non_relevant_beta_hits",
        "test_draws_are_distinct_pool_members_and_every_member_is_drawn_in_time",
        "test_a_pool_smaller_than_the_count_pads_with_the_rows_positive_excluded",
        "test_the_objective_scores_the_retrieved_negatives_after_any_mined_ones",
        "test_on_rank_1_of_2_the_objective_retrieves_for_the_global_batch_and_encodes_its_rows_draws",
        "test_switched_off_the_objective_is_the_in_batch_loss_and_retrieves_nothing",
        "test_the_train_stages_index_is_the_corpus_bags_at_the_training_passage_length",
        "test_more_draws_than_the_pool_holds_are_refused")],
    "model_code/models/encoder.py": [*MLR_TESTS, *HCE_FAST],
    "model_code/methods/mlr/layer_mix.py": MLR_TESTS,
    "model_code/methods/mlr/loss.py": [*HCE_TESTS, *MLR_TESTS],
    "model_code/training/negatives.py": NEGATIVES_TESTS,
    "model_code/training/pairs.py": [*HCE_TESTS, *TRAINING_PAIRS],
    "model_code/training/selection.py": [T + "training/test_selection.py"],
}
# added to every pytest session mutmut starts (see the module docstring)
PYTEST_ARGS = ["-p", "no:unraisableexception"]
MODULES = list(MODULE_TESTS)
WARM_UP = """

def _freeze_for_forks() -> None:
    import gc

    gc.freeze()  # what the fork server holds now is never garbage: each mutant's collections skip it


_freeze_for_forks()
"""


def scratch_copy() -> Path:
    """The committed tree (what a run mutates) extracted to a temporary folder: the caller removes it."""
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
            f"pytest_add_cli_args={block(PYTEST_ARGS)}\n"
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
        mutants.append({"name": name, "module": module, "function": function, "status": status})
    mutants = [m for m in mutants if m["module"] in modules]
    diffs = survivor_diffs(copy, [m["name"] for m in mutants if m["status"] not in KILLED])
    return [{**m, "diff": diffs[m["name"]]} if m["name"] in diffs else m for m in mutants]


# what `mutmut show NAME` prints, for many mutants in one process (a `mutmut show` process each took ~1 s)
SHOW = """
import json, sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant, status_by_exit_code
shown = {}
for name in json.loads(sys.stdin.read()):
    m = find_mutant(name)
    shown[name] = f"# {name}: {status_by_exit_code[m.exit_code_by_key[name]]}\\n{get_diff_for_mutant(name, path=m.path)}\\n"
print("SHOWN " + json.dumps(shown))
"""


def survivor_diffs(copy: Path, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    run = subprocess.run([sys.executable, "-c", SHOW], input=json.dumps(names), check=True, cwd=copy,
                         capture_output=True, text=True)
    [line] = [line for line in run.stdout.splitlines() if line.startswith("SHOWN ")]
    return json.loads(line.removeprefix("SHOWN "))


def prepared_copy(modules: list[str], tests: list[str]) -> Path:
    copy = scratch_copy()
    (copy / "setup.cfg").write_text(setup_cfg(modules, tests))
    with open(copy / "tests" / "conftest.py", "a") as conftest:
        conftest.write(WARM_UP)
    return copy


def test_selection(modules: list[str]) -> list[str]:
    return list(dict.fromkeys(t for module in modules for t in MODULE_TESTS[module]))


def test_files(module: str, module_tests: dict[str, list[str]] = MODULE_TESTS) -> list[str]:
    """The files of a module's test selection (a ``file::test`` id names its file)."""
    return list(dict.fromkeys(test.split("::")[0] for test in module_tests[module]))


def sha256_of(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def fingerprint(module: str, root: Path, module_tests: dict[str, list[str]] = MODULE_TESTS) -> dict:
    """sha256 of the module's source and of each of its test files, as they are under ``root``."""
    return {"source": {module: sha256_of(root / module)},
            "tests": {path: sha256_of(root / path) for path in test_files(module, module_tests)}}


def why_rerun(module: str, recorded: dict, root: Path,
              module_tests: dict[str, list[str]] = MODULE_TESTS) -> str | None:
    """Why the module's recorded results (its ``summary.json`` entry) are out of date with the files
    under ``root``; None: they are not."""
    now = fingerprint(module, root, module_tests)
    if now["source"] != recorded["source"]:
        return f"source changed ({module})"
    if set(now["tests"]) != set(recorded["tests"]):
        return "test selection changed (" + ", ".join(sorted(set(now["tests"]) ^ set(recorded["tests"]))) + ")"
    changed = [path for path, digest in now["tests"].items() if recorded["tests"][path] != digest]
    if changed:
        return "tests changed (" + ", ".join(changed) + ")"
    return None


def select_modules(summary: dict, root: Path, modules: list[str] | None = None,
                   module_tests: dict[str, list[str]] = MODULE_TESTS) -> tuple[dict[str, str], list[str]]:
    """The modules whose results must be re-measured (module -> why) and those whose results are kept."""
    recorded = summary.get("modules", {})
    rerun: dict[str, str] = {}
    kept: list[str] = []
    for module in modules or list(module_tests):
        why = "never run" if module not in recorded else why_rerun(module, recorded[module], root, module_tests)
        if why is None:
            kept.append(module)
        else:
            rerun[module] = why
    return rerun, kept


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def summarize(results: dict, modules: list[str], run: dict | None = None,
              fingerprints: dict[str, dict] | None = None) -> None:
    """Rewrite the entries of ``modules`` in ``summary.json`` from their full ``results``: with
    ``fingerprints`` ``run`` re-mutated them (each gets its new fingerprint); otherwise the
    fingerprint stays, and ``run``, if any, re-tested their survivors (its commit is added to
    ``retested_at``). The other modules' entries stay, and so do the runs (less their test
    selections) whose results it holds."""
    from report import explanation  # type: ignore[import-not-found]

    summary = read_json(SUMMARY)
    entries = summary.get("modules", {})
    for module in modules:
        mutants = [m for m in results["mutants"] if m["module"] == module]
        survivors = [m for m in mutants if m["status"] not in KILLED]
        unexplained = [m for m in survivors if explanation(m) is None]
        checks = {name: check for name, check in results.get("killers", {}).items() if module_of(name) == module}
        measured = (fingerprints[module] if fingerprints else entries[module] if run is None else
                    {**entries[module], "retested_at": [*entries[module].get("retested_at", []), run["commit"]]})
        entries[module] = {
            **{k: v for k, v in measured.items() if k in ("commit", "retested_at", "source", "tests")},
            "mutants": len(mutants), "killed": len(mutants) - len(survivors),
            "equivalent": len(survivors) - len(unexplained),
            "unexplained": [{k: m[k] for k in ("name", "status", "diff") if k in m} for m in unexplained],
            "killer_checks": len(checks), "killers_not_failing": sorted(n for n, c in checks.items() if not c["fails"])}
    held = {(entry["commit"], module) for module, entry in entries.items()} | {
        (commit, module) for module, entry in entries.items() for commit in entry.get("retested_at", [])}
    runs = [r for r in [*summary.get("runs", []), *([{k: v for k, v in run.items() if k != "tests"}] if run else [])]
            if any((r["commit"], module) in held for module in r["modules"])]
    write_json(SUMMARY, {**summary, "modules": dict(sorted(entries.items())), "runs": runs})


def retest(modules: list[str], max_children: int) -> None:
    """The survivors of ``modules`` that survivors.py does not explain as equivalent (those compute
    the same, so no test can kill them) re-tested in one mutmut run (one set of fixed costs); their
    full results must be in ``out/`` (a run of the module on this machine)."""
    from report import explanation  # type: ignore[import-not-found]

    results = read_json(RESULTS)
    if missing := sorted(set(modules) - {m["module"] for m in results.get("mutants", [])}):
        raise SystemExit(f"no full results of {missing} in {RESULTS}: run.py --modules {' '.join(missing)} first")
    names = [m["name"] for m in results["mutants"]
             if m["module"] in modules and m["status"] not in KILLED and explanation(m) is None]
    if not names:
        return
    commit, tests, load_at_start = head_commit(), test_selection(modules), os.getloadavg()[0]
    copy = prepared_copy(modules, tests)
    start = time.perf_counter()
    mutmut(copy, "run", "--max-children", str(max_children), *names)
    fresh = {m["name"]: m for m in collect(copy, modules, set(names))}
    results["mutants"] = [fresh.get(m["name"], m) if m["name"] in names else m for m in results["mutants"]]
    results["killers"] = results.get("killers", {}) | check_killers(copy, modules, commit)
    run = {"commit": commit, "modules": modules, "seconds": round(time.perf_counter() - start),
           "workers": max_children, "tests": tests, "retested_survivors": len(names),
           "load_at_start": round(load_at_start, 2), "load_at_end": round(os.getloadavg()[0], 2)}
    results["runs"].append(run)
    write_json(RESULTS, results)
    summarize(results, modules, run)
    shutil.rmtree(copy, ignore_errors=True)


KILLED = {"killed", "timeout", "segfault"}


def module_of(name: str) -> str:
    return name.split(".x")[0].replace(".", "/") + ".py"


def check_killers(copy: Path, modules: list[str], commit: str) -> dict[str, dict]:
    """survivors.KILLED_BY's pairs of these modules, each test run alone on its mutant (killers.py)."""
    from survivors import KILLED_BY  # type: ignore[import-not-found]

    pairs = [(name, test) for name, test, _ in KILLED_BY if module_of(name) in modules]
    if not pairs:
        return {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(HERE / "killers.py"), str(copy / "mutants"), json.dumps(pairs)],
                         check=True, capture_output=True, text=True, env=env)
    [line] = [line for line in run.stdout.splitlines() if line.startswith("KILLERS ")]
    fails = json.loads(line.removeprefix("KILLERS "))
    return {name: {"test": test, "fails": fails[name], "commit": commit} for name, test in pairs}


def run_modules(modules: list[str], max_children: int, keep: bool) -> int:
    """One mutmut run over ``modules``; its results replace theirs in ``out/results.json`` and
    ``summary.json``. Returns its seconds."""
    commit, tests, load_at_start = head_commit(), test_selection(modules), os.getloadavg()[0]
    copy = prepared_copy(modules, tests)
    fingerprints = {module: {"commit": commit, **fingerprint(module, copy)} for module in modules}  # what is mutated
    start = time.perf_counter()
    print(f"mutmut in {copy} over {modules}, {max_children} worker(s)", flush=True)
    mutmut(copy, "run", "--max-children", str(max_children))
    seconds, load_at_end = round(time.perf_counter() - start), os.getloadavg()[0]
    mutants = collect(copy, modules)
    killers = check_killers(copy, modules, commit)
    previous = read_json(RESULTS)
    run = {"commit": commit, "modules": modules, "seconds": seconds, "workers": max_children, "tests": tests,
           "load_at_start": round(load_at_start, 2), "load_at_end": round(load_at_end, 2)}
    results = {"runs": [*(r for r in previous.get("runs", []) if not set(r["modules"]) <= set(modules)), run],
               "mutants": [*(m for m in previous.get("mutants", []) if m["module"] not in modules), *mutants],
               "killers": {k: v for k, v in previous.get("killers", {}).items() if module_of(k) not in modules} | killers}
    write_json(RESULTS, results)
    summarize(results, modules, run, fingerprints)
    print(f"  {len(mutants)} mutants, {seconds} s", flush=True)
    if not keep:
        shutil.rmtree(copy, ignore_errors=True)
    return seconds


def plan(everything: bool) -> tuple[dict[str, str], list[str]]:
    """``--make``'s modules: those to re-mutate (module -> why) and those kept, printed."""
    summary = read_json(SUMMARY)
    head = scratch_copy()
    try:
        rerun, kept = ({module: "--all" for module in MODULES}, []) if everything else select_modules(summary, head)
        uncommitted = [m for m in MODULES if fingerprint(m, ROOT) != fingerprint(m, head)]
    finally:
        shutil.rmtree(head, ignore_errors=True)
    recorded = summary.get("modules", {})
    for module in MODULES:
        if module in rerun:
            print(f"re-run  {module}: {rerun[module]}", flush=True)
        else:
            print(f"keep    {module}: unchanged since {recorded[module]['commit']}", flush=True)
    for module in uncommitted:
        print(f"note    {module}: the checkout differs from HEAD in it or its tests; the run mutates HEAD "
              "(commit first)", flush=True)
    return rerun, kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modules", nargs="*", help="only these modules (paths as in MODULES)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    parser.add_argument("--survivors-of", metavar="MODULE", nargs="+",
                        help="re-test only the mutants of these modules that survived in out/results.json and are "
                             "not explained as equivalent, in one mutmut run (after adding tests: a mutant killed "
                             "before stays killed by a larger suite)")
    parser.add_argument("--killers-only", metavar="DIR",
                        help="only re-check survivors.KILLED_BY in a scratch copy kept by --keep (its modules)")
    parser.add_argument("--make", action="store_true",
                        help="what `make mutation` runs: deliberate_errors.py, then the modules whose source or tests "
                             "changed since their results (fingerprints in summary.json); the wall time of both is "
                             "recorded in summary.json and the report")
    parser.add_argument("--all", action="store_true",
                        help="with --make (`make mutation-full`): re-mutate every module, changed or not")
    args = parser.parse_args()
    if args.all and not args.make:
        raise SystemExit("--all goes with --make (without --make, run.py re-mutates every module anyway)")
    if args.killers_only:
        results = read_json(RESULTS)
        mutated = Path(args.killers_only) / "mutants"  # it holds every source file, mutated or not
        kept_modules = sorted(module for module in {m["module"] for m in results["mutants"]}
                              if (mutated / module).exists() and "__mutmut_orig" in (mutated / module).read_text())
        results["killers"] = results.get("killers", {}) | check_killers(Path(args.killers_only), kept_modules,
                                                                        head_commit())
        write_json(RESULTS, results)
        summarize(results, kept_modules)
        subprocess.run([sys.executable, str(HERE / "report.py")], check=True)
        return
    if args.survivors_of:
        unknown = set(args.survivors_of) - set(MODULES)
        if unknown:
            raise SystemExit(f"not a method-core module: {sorted(unknown)}")
        retest(args.survivors_of, args.max_children)
        subprocess.run([sys.executable, str(HERE / "report.py")], check=True)
        return
    modules = args.modules or MODULES
    unknown = set(modules) - set(MODULES)
    if unknown:
        raise SystemExit(f"not a method-core module: {sorted(unknown)}")
    if args.make:
        if args.modules:
            raise SystemExit("--make chooses the modules itself (--all: every module)")
        start, load, commit = time.perf_counter(), os.getloadavg()[0], head_commit()
        rerun, kept = plan(args.all)
        subprocess.run([sys.executable, str(HERE / "deliberate_errors.py"), "--jobs", str(args.max_children)],
                       check=True)
        errors_seconds = round(time.perf_counter() - start)
        mutmut_seconds = run_modules(list(rerun), args.max_children, args.keep) if rerun else 0
        summary = read_json(SUMMARY)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary["make"] = {"commit": commit, "seconds": round(time.perf_counter() - start),
                           "cpu_seconds": round(children.ru_utime + children.ru_stime),
                           "deliberate_errors_seconds": errors_seconds, "mutmut_seconds": mutmut_seconds,
                           "workers": args.max_children, "cpus": os.cpu_count(), "load_at_start": round(load, 2),
                           "load_at_end": round(os.getloadavg()[0], 2), "all": args.all, "rerun": rerun,
                           "kept": kept}
        if args.all:
            summary["make_full"] = summary["make"]
        write_json(SUMMARY, summary)
    else:
        run_modules(modules, args.max_children, args.keep)
    subprocess.run([sys.executable, str(HERE / "report.py")], check=True)


if __name__ == "__main__":
    main()
