# `make run`  : create .venv, install clustersim, simulate the built-in default scenario.
# `make test` : create .venv, install clustersim with test extras and the CPU build of torch
#               (calibration tests time real torch kernels and gloo collectives), Chromium from
#               Debian when missing and running as root (the report is tested in a real headless
#               browser through Playwright, which drives /usr/bin/chromium: no browser download),
#               then lint (ruff: pyflakes, bugbear, simplify, isort, complexity, line length 110;
#               a violation fails the run), build the docs site (mkdocs --strict: a broken link or a
#               page missing from it fails the run) and run the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch; a bare `torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: setup setup-test run lint docs test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(BIN)/.installed-test: $(BIN)/.installed pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]' '$(TORCH)'
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Chromium (Debian package) for the report's browser test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: no Chromium and no root apt-get: the report's browser test will be skipped"; fi; }
	touch $@

setup: $(BIN)/.installed
setup-test: $(BIN)/.installed-test

run: setup
	$(BIN)/clustersim run preset:default

lint: setup-test
	$(BIN)/ruff check clustersim tests benchmarks
	$(BIN)/ruff format --check clustersim tests benchmarks

# --strict: a warning (a link to a missing page or anchor) fails the build; the site goes to site/
docs: setup-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint docs
	$(BIN)/python -m pytest -q -rs   # -rs: every skipped test says why (e.g. no root for the testbed)

# Each benchmark times a baseline commit against the working tree, interleaved in one run; see
# benchmarks/_abtest.py. On a shared machine prefix with `nice -n 19` and read only the ratios.
bench: setup
	$(BIN)/python benchmarks/bench_run.py
	$(BIN)/python benchmarks/bench_scaling.py
	$(BIN)/python benchmarks/bench_cli.py
	$(BIN)/python benchmarks/bench_sweep.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache site
