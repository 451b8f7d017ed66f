"""Apply each deliberate method error (issue #27's, and MLR's since) to a scratch copy of the
committed tree, run the tests that should notice it, and record which test failed (``deliberate_errors.json``).

    .venv/bin/python tests/mutation/deliberate_errors.py [--only NAME ...] [--jobs 2]

The checkout itself is never modified: the copy comes from ``git archive HEAD`` and each error is
one textual replacement there, undone before the next. With ``--jobs N`` N copies take the errors
in turn (the slowest first), each test run on one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from run import HCE, HCE_FAST, INCDSI_TESTS, MLR, SVDR_TESTS, scratch_copy  # type: ignore[import-not-found]  # the same scratch tree and fast tests as the mutmut run

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("deliberate_errors.json")

HCE_TRAINING = [HCE + "test_training.py", "-k", "modes or em_reclustering or joint_with_em or outside_hierarchy"]
INCDSI = INCDSI_TESTS  # the head, its training and the tuning checks written with them
# the layer vectors against hand-pooled hidden states, search against brute force, each pooling's loss by
# hand, the scalar mix's start and the self-contrastive index (the last two train a tiny model)
MLR_TESTS = [MLR + "test_retriever.py", MLR + "test_kind.py", MLR + "test_training.py"]

# name, file, old text, new text, tests to run
ERRORS = [
    ("HCE: sampled negatives also on the document->query side (Eq. 8)", "model_code/losses/contrastive.py",
     "    forward = torch.cat([forward, *added], dim=1)",
     "    forward = torch.cat([forward, *added], dim=1)\n    backward = torch.cat([backward, *added], dim=1)",
     HCE_FAST),
    ("HCE: alpha ignored in HCE-J", "model_code/methods/hce/training.py",
     'weight = 1.0 if mode == "U" else params.hce.alpha', "weight = 1.0", HCE_TRAINING),
    ("HCE: level losses averaged instead of summed", "model_code/methods/hce/loss.py",
     "torch.stack(contrastive).sum()", "torch.stack(contrastive).mean()", HCE_FAST),
    ("HCE: EM re-clustering from the stale starting embeddings", "model_code/methods/hce/training.py",
     "build_tree(doc_ids, fresh,", "build_tree(doc_ids, embeddings,", HCE_TRAINING),
    ("HCE: CT trained with the tree terms", "model_code/methods/hce/training.py",
     'if hce.mode == "CT":', "if False:", HCE_TRAINING),
    ("HCE: K = floor(N/b) clusters instead of ceil(N/b)", "model_code/hierarchy/tree.py",
     "points, k = embeddings, -(-n // branching)", "points, k = embeddings, n // branching", HCE_FAST),
    ("IncDSI: the 2*lambda2*v gradient term dropped", "model_code/methods/incdsi/head.py",
     'np.einsum("i,ij->j", h2, violated) + 2 * lambda2 * v', 'np.einsum("i,ij->j", h2, violated)', INCDSI),
    ("IncDSI: the l2 gradient halved", "model_code/methods/incdsi/head.py",
     '2 * (1 - lambda1) * np.einsum("i,ij->j", h2, violated)', '(1 - lambda1) * np.einsum("i,ij->j", h2, violated)',
     INCDSI),
    ("IncDSI: gamma2 removed from the optimised loss", "model_code/methods/incdsi/head.py",
     'np.einsum("ij,j->i", z, v) - own + params.gamma2, 0)', 'np.einsum("ij,j->i", z, v) - own, 0)', INCDSI),
    ("IncDSI: gamma2 removed from the reported loss", "model_code/methods/incdsi/head.py",
     "torch.relu(slack + params.gamma2).pow(2).sum()", "torch.relu(slack).pow(2).sum()", INCDSI),
    ("IncDSI: the old-document clause removed from separable", "model_code/methods/incdsi/head.py",
     "bool(wins > best_other) and bool((slack < 0).all())", "bool(wins > best_other)", INCDSI),
    ("IncDSI: +5 added to appended own logits", "model_code/methods/incdsi/head.py",
     "own_logits[n] = row, q_bar, row @ q_bar", "own_logits[n] = row, q_bar, row @ q_bar + 5", INCDSI),
    ("IncDSI: (old, new) passed to f_beta in tune_addition", "model_code/methods/incdsi/tuning.py",
     "return f_beta(new, old, beta)", "return f_beta(old, new, beta)", INCDSI),
    ("IncDSI: F-beta objective keeps the worst trial", "model_code/methods/incdsi/tuning.py",
     'return max(trials, key=lambda t: t["value"])', 'return min(trials, key=lambda t: t["value"])', INCDSI),
    ("IncDSI: F-beta study minimises", "model_code/methods/incdsi/tuning.py",
     'direction="maximize"', 'direction="minimize"', INCDSI),
    ("IncDSI: gamma2 search range widened to 0-80", "model_code/methods/incdsi/tuning.py",
     'suggest_float("gamma2", 0.0, 8.0)', 'suggest_float("gamma2", 0.0, 80.0)', INCDSI),
    ("SVDR: max pooling over padding positions too (no attention mask)", "model_code/methods/svdr/model.py",
     'logits.masked_fill(padding, float("-inf")).amax(dim=1)', "logits.amax(dim=1)", SVDR_TESTS),
    ("SVDR: ELU1p offset 0.5 instead of 1", "model_code/methods/svdr/model.py",
     ".amax(dim=1).float()) + 1.0", ".amax(dim=1).float()) + 0.5", SVDR_TESTS),
    ("SVDR: the q.bin_p term dropped from the 1/4 sum", "model_code/methods/svdr/loss.py",
     'pairs |= {"q.p_k": (q, p_k), "q.bin_p": (q, bin_p)}', 'pairs |= {"q.p_k": (q, p_k)}', SVDR_TESTS),
    ("SVDR: top-k OR the lexical mask replaced by top-k alone", "model_code/methods/svdr/model.py",
     "mask = torch.maximum(mask, lexical)", "mask = mask", SVDR_TESTS),
    ("SVDR: the binary index counts repeated tokens (term frequency, not 0/1)", "model_code/methods/svdr/token_bags.py",
     "matrix.data[:] = 1.0", "matrix.data[:] = matrix.data", SVDR_TESTS),
    ("SVDR: alpha encodes the query (full search, not the binary query)", "model_code/methods/svdr/retriever.py",
     'encoded = self.encoder.tokens(queries, "query")', 'encoded = self.encoder.embed(queries, "query", lexical=True)',
     SVDR_TESTS),
    ("SVDR: beta_rerank searches k deep, re-scoring fewer than m passages", "model_code/methods/svdr/retriever.py",
     'depth = max(k, self.settings.rerank_depth) if mode == "beta_rerank" else k', "depth = k", SVDR_TESTS),
    ("SVDR: the symmetric NLL at temperature 0.05 instead of 1", "model_code/methods/svdr/loss.py",
     "bidirectional_infonce(a[rows], b[rows], 1.0,", "bidirectional_infonce(a[rows], b[rows], 0.05,", SVDR_TESTS),
    ("MLR: layer l read from hidden state l - 1 (the embedding layer is state 0)", "model_code/models/encoder.py",
     'self.pool(states[layer], batch["attention_mask"])', 'self.pool(states[layer - 1], batch["attention_mask"])', MLR_TESTS),
    ("MLR: multi-vector search depth k instead of k * m", "model_code/methods/mlr/retriever.py",
     "depth = k * rows_per_document(self.settings)", "depth = k", MLR_TESTS),
    ("MLR: index rows laid out layer-major (row r is not document r // m)", "model_code/methods/mlr/retriever.py",
     "return [doc_id for doc_id in doc_ids for _ in range(rows_per_document(settings))]",
     "return [doc_id for _ in range(rows_per_document(settings)) for doc_id in doc_ids]", MLR_TESTS),
    ("MLR: self-contrastive positive scored by its best layer, not its last (Eq. 5)", "model_code/methods/mlr/loss.py",
     "pooled_forward = pooled_forward.index_put((rows, targets), positive[:, 0])",
     "pooled_forward = pooled_forward.index_put((rows, targets), positive.amax(-1))", MLR_TESTS),
    ("MLR: self-contrastive regulariser targets the lowest listed layer (Eq. 6)", "model_code/methods/mlr/loss.py",
     "F.cross_entropy(positive / temperature, torch.zeros_like(rows))",
     "F.cross_entropy(positive / temperature, torch.full_like(rows, positive.shape[1] - 1))", MLR_TESTS),
    ("MLR: scalar mix initialised non-uniform", "model_code/methods/mlr/layer_mix.py",
     "self.logits = torch.nn.Parameter(torch.zeros(len(layers)))",
     "self.logits = torch.nn.Parameter(torch.arange(len(layers), dtype=torch.float32))", MLR_TESTS),
    ("MLR: self-contrastive index holds every layer (averaged) instead of the last", "model_code/methods/mlr/retriever.py",
     'return settings.layers[:1] if settings.pooling == "self_contrastive" else settings.layers',
     "return settings.layers", MLR_TESTS),
]


def failed_tests(output: str) -> list[str]:
    return sorted({line.split()[1] for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))})


def apply(copy: Path, error: tuple, commit: str, env: dict) -> dict:
    name, path, old, new, tests = error
    target = copy / path
    original = target.read_text()
    if original.count(old) != 1:
        raise SystemExit(f"{name}: the text to replace occurs {original.count(old)} times in {path}")
    target.write_text(original.replace(old, new))
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", *tests], check=False, cwd=copy,
                         capture_output=True, text=True, env=env)
    target.write_text(original)
    killed_by = failed_tests(run.stdout + run.stderr)
    print(f"{'KILLED ' if run.returncode else 'SURVIVED'} {name}: {killed_by}", flush=True)
    return {"error": name, "commit": commit, "file": path, "replace": old, "with": new, "killed": run.returncode != 0,
            "killed_by": killed_by, "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", help="substrings of error names to run")
    parser.add_argument("--jobs", type=int, default=1, help="errors tested at once, each in its own copy")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    previous = json.loads(OUT.read_text())["errors"] if OUT.exists() else []
    results = previous if args.only else []
    chosen = [e for e in ERRORS if not args.only or any(s in e[0] for s in args.only)]
    seconds = {r["error"]: r.get("seconds", 0) for r in previous}
    todo: queue.Queue = queue.Queue()
    for error in sorted(chosen, key=lambda e: -seconds.get(e[0], 0)):  # the slowest first
        todo.put(error)
    env = {**os.environ, **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if args.jobs > 1 else {})}
    done: list[dict] = []
    failures: list[str] = []

    def worker() -> None:
        copy = scratch_copy()
        try:
            while not failures:
                try:
                    error = todo.get_nowait()
                except queue.Empty:
                    return
                done.append(apply(copy, error, commit, env))
        except BaseException as failure:  # noqa: BLE001 - reported by the main thread
            failures.append(str(failure))
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, args.jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit("; ".join(failures))
    if len(done) != len(chosen):
        raise SystemExit(f"only {len(done)} of {len(chosen)} errors were tested")
    names = {r["error"] for r in done}
    results = [r for r in results if r["error"] not in names] + done
    order = [e[0] for e in ERRORS]
    results.sort(key=lambda r: order.index(r["error"]))
    OUT.write_text(json.dumps({"errors": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
