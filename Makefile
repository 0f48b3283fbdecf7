# `make run`  : create .venv, install clustersim, simulate the built-in default scenario.
# `make test` : create .venv, install clustersim with test extras and the CPU build of torch
#               (calibration tests time real torch kernels and gloo collectives), run the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch; a bare `torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: setup setup-test run test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(BIN)/.installed-test: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test]' '$(TORCH)'
	touch $@

setup: $(BIN)/.installed
setup-test: $(BIN)/.installed-test

run: setup
	$(BIN)/clustersim run preset:default

test: setup-test
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_run.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
