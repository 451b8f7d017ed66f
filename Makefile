# Two commands do all set-up on a fresh machine:
#   make demo   - create .venv if absent, install, run the whole pipeline on the built-in corpus
#   make test   - same set-up, then the test suite (fast tier; `make test-slow` for the rest)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME := $(CURDIR)/.dagster_home
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export GX_ANALYTICS_ENABLED := false
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false

# pip's find-links (its environment variable, else its config files): where the machine keeps torch's CPU build
LOCAL_WHEELS ?= $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
SERVE_PORT ?= 5001
MILVUS_ENGINE ?= lite

.PHONY: install demo test test-slow dagster-ui mlflow-ui serve dvc-repro clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	# uv installs in about 1 min what pip took 4 min 20 s to (2 cores). torch is pinned: its CPU build comes from the
	# machine's local wheels (LOCAL_WHEELS: pip's find-links, which uv does not read), never a CUDA build.
	# --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (these machines set it) a package installed
	# without its .pyc files is compiled again by every process that imports it, which made the test suite 20 % slower
	$(BIN)/pip install -qq uv==0.13.9
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode $(if $(LOCAL_WHEELS),--find-links $(LOCAL_WHEELS)) -e '.[dev]'
	# numba compiles IncDSI's optimiser once, here, into its cache beside the source (not once per test process)
	$(BIN)/python -c 'from model_code.methods.incdsi.lbfgs import compile_ahead; compile_ahead()'
	@touch $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: orchestration/dagster.yaml
	@mkdir -p $(DAGSTER_HOME)
	cp orchestration/dagster.yaml $@

install: $(STAMP) $(DAGSTER_HOME)/dagster.yaml

# the full_pipeline job (the data, model and evaluation groups) in one process: one screen of progress bars,
# without Dagster's per-step DEBUG lines, its CLI's supersession notice or MLflow's INFO lines
demo: install
	$(BIN)/python -m orchestration.milvus_lite up --engine $(MILVUS_ENGINE) --if-params-use-it params.yaml  # index.backend: milvus only
	PYTHONWARNINGS=ignore::Warning:click.core MLFLOW_LOGGING_LEVEL=WARNING \
	  $(BIN)/dagster job execute -j full_pipeline -m orchestration.definitions -c orchestration/demo_run.yaml
	$(BIN)/python -m model_code.report .
	@echo
	@echo "Open the UIs:"
	@echo "  DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/dagster dev -m orchestration.definitions   # http://127.0.0.1:3000"
	@echo "  $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db     # http://127.0.0.1:5000"
	@echo "Keep it fresh (with dagster dev running): $(BIN)/fresh-retriever submit-documents NEW_DOCS.jsonl"

# tests run in parallel processes (pytest-xdist): two more than the cores, at most 4 (each holds torch,
# MLflow, Dagster, ~2 GB): many tests wait on subprocesses, servers, daemons and SQLite, so a 2-core
# machine kept 1.2 cores busy with 2 workers (933 s), and 1.6 with 3 (1,012 s of a larger suite). worksteal:
# an idle worker takes queued tests from a busy one, so the minutes-long DVC and fault tests do not leave
# one worker running alone at the end. `make test TEST_WORKERS=1` runs them one at a time.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n + 2 < 4 ? n + 2 : 4 )))

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=10

test-slow: install
	$(BIN)/python -m pytest -q -m slow

dagster-ui: install
	$(BIN)/dagster dev -m orchestration.definitions

mlflow-ui: install
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db

# the registered champion over HTTP, following the champion alias (serve.follow): no restart for new versions
serve: install
	$(BIN)/fresh-registry serve --port $(SERVE_PORT)

dvc-repro: install
	$(BIN)/python -m orchestration.milvus_lite up --engine $(MILVUS_ENGINE) --if-params-use-it params.yaml
	$(BIN)/dvc repro

# the production stack on this machine (orchestration/stack.py, files in .stack/): PostgreSQL, the Dagster daemon and
# webserver on it, the MLflow server on it with proxied artifacts, the Milvus Lite server; `source .stack/env` to use it
.PHONY: stack stack-down stack-status test-stack postgres-installed
postgres-installed:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null)

stack: install postgres-installed
	$(BIN)/python -m orchestration.stack up

stack-down:
	@test ! -x $(BIN)/python || $(BIN)/python -m orchestration.stack down

stack-status:
	@$(BIN)/python -m orchestration.stack status

# the freshness loop and its faults against the stack (each test starts a stack of its own on free ports and
# stops it); not part of `make test`
test-stack: install postgres-installed
	$(BIN)/python -m pytest -q -m stack tests/stack --durations=10

# the loopback Milvus server of index.backend: milvus (data in .cache/milvus, 127.0.0.1:19530), by its pid:
# Milvus Lite, or with MILVUS_ENGINE=standalone Milvus 2.3 standalone (x86-64 Linux; docs/scale.md)
.PHONY: milvus-up milvus-down milvus-status
milvus-up: install
	$(BIN)/python -m orchestration.milvus_lite up --engine $(MILVUS_ENGINE)

milvus-down:
	@test ! -x $(BIN)/python || $(BIN)/python -m orchestration.milvus_lite down

milvus-status:
	@$(BIN)/python -m orchestration.milvus_lite status

# mutation testing of the methods' mathematics against their fast unit tests (not part of `make test`): the
# deliberate method errors (31; their tests take 685 s one after another, two at a time on 2 cores), then mutmut;
# writes tests/mutation/summary.json and REPORT.md (committed: per module its counts, the survivors not explained,
# its fingerprint) and the full results, every mutant and survivor, to tests/mutation/out/ (git-ignored).
# `make mutation` is incremental: it re-mutates only the modules whose source or test files changed since their
# results were measured (sha256 fingerprints in tests/mutation/summary.json) and prints which it re-runs and
# why; `make mutation-full` re-mutates every module of tests/mutation/run.py's MODULE_TESTS, over an hour on
# 2 cores (tests/mutation/REPORT.md has each run's wall time and mutant counts).
# One module: .venv/bin/python tests/mutation/run.py --modules model_code/hierarchy/tree.py
.PHONY: mutation mutation-full
mutation: install
	$(BIN)/python tests/mutation/run.py --make

mutation-full: install
	$(BIN)/python tests/mutation/run.py --make --all

# a minute of coverage-guided fuzzing of the document-batch reader (atheris; not part of `make test`); inputs it
# finds interesting join tests/fuzz/corpus, a crash is written as crash-<hash> with the input that caused it
.PHONY: fuzz
fuzz: install
	$(BIN)/pip install -qq atheris==2.3.0
	$(BIN)/python tests/fuzz/fuzz_batches.py tests/fuzz/corpus -max_total_time=60 -rss_limit_mb=4096

clean: milvus-down stack-down
	rm -rf data models reports mlruns .dagster_home inbox .cache/milvus
