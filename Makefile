# `make run`  : create .venv, install clustersim, simulate the built-in default scenario.
# `make test` : create .venv, install clustersim with test extras, run the test suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup run test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/clustersim run preset:default

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_run.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
