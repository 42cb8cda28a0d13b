# Set-up and everyday commands. `make train` and `make test` do the whole set-up on a fresh machine.
# The interpreter .venv is made with; `make install PYTHON=python3.12` on an existing .venv of another version
# makes .venv anew with it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The pinned versions the installs use; `make test LOCK=` installs the newest that pyproject.toml allows.
LOCK ?= requirements.lock
# The pip that installs them: a new venv's own pip (23.2 with Python 3.11) resolves the lock far slower.
PIP_VERSION := 26.1.2
# Python writes each module's bytecode (__pycache__) the first time a process imports it, and later processes
# read it. An environment that turns that off (PYTHONDONTWRITEBYTECODE, set in CI images and Dockerfiles) would
# have every process compile torch and Lightning again (about 7 s each): these commands let Python write it. So
# pip installs with --no-compile: compiling all it installs would take 40 s, for modules a run mostly never
# imports.
unexport PYTHONDONTWRITEBYTECODE
# What `make test` installs on top of the project: every extra of pyproject.toml (the dev tools and every
# optional integration, which the tests cover).
TEST_EXTRAS = $(shell sed -n '/^\[project.optional-dependencies\]/,/^\[/s/^\([a-z]*\) = .*/\1/p' pyproject.toml | paste -sd, -)
# One stamp per install: each reruns when pyproject.toml, the lock or the install settings change.
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
SETTINGS := $(VENV)/.settings

.PHONY: help install install-test train test test-fast lint format clean FORCE

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# Rewritten only when PYTHON (given explicitly, of another version) or LOCK differ from the last install's, so
# changing either re-installs instead of being ignored by an up-to-date stamp.
$(SETTINGS): FORCE
	@if [ "$(origin PYTHON)" != file ]; then \
	  want=$$($(PYTHON) -c 'import sys; print(sys.version_info[:2])') \
	    || { echo "PYTHON=$(PYTHON) does not run; give an installed interpreter, e.g. PYTHON=python3.12"; exit 1; }; \
	  if [ -x $(PY) ] && [ "$$($(PY) -c 'import sys; print(sys.version_info[:2])')" != "$$want" ]; then \
	    echo "PYTHON=$(PYTHON) is not the Python of $(VENV): making $(VENV) anew"; rm -rf $(VENV); fi; fi
	@mkdir -p $(VENV)
	@echo "LOCK=$(LOCK)" | cmp -s - $@ || echo "LOCK=$(LOCK)" > $@

$(STAMP): pyproject.toml requirements.lock $(SETTINGS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==$(PIP_VERSION)
	$(PY) -m pip install --no-compile -e . $(if $(LOCK),-c $(LOCK))
	touch $@

$(TEST_STAMP): pyproject.toml requirements.lock $(SETTINGS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==$(PIP_VERSION)
	$(PY) -m pip install --no-compile -e ".[$(TEST_EXTRAS)]" $(if $(LOCK),-c $(LOCK))
	touch $(STAMP) $@

install: $(STAMP)  ## create .venv and install the project with the pinned dependencies (what train needs)

install-test: $(TEST_STAMP)  ## install, plus the dev tools and the optional integrations the tests cover

train: install  ## train with the default config (offline MNIST digits) and print the test metrics
	$(PY) src/train.py

test: install-test  ## run the whole test suite (what CI runs)
	$(PY) -m pytest -n 2 --dist worksteal

test-fast: install-test  ## run the tests not marked slow
	$(PY) -m pytest -n 2 --dist worksteal -m "not slow"

# part: template
.PHONY: test-parts bench
test-parts: install-test  ## the template's own checks: a project with each choice of parts installs and passes its tests; copier update; the benchmarks' smoke runs
	$(PY) -m pytest -n 2 --matrix -m matrix

# benchmark_streaming.py reads shards (the streaming extra) from moto's S3 server (a dev tool).
bench: install-test  ## the template measured: the core's size, its speed against bare Lightning and hand-written loops, shards against folders (a few minutes)
	$(PY) scripts/count_lines.py
	$(PY) scripts/benchmark.py
	$(PY) scripts/benchmark_streaming.py

# /part

lint: install-test  ## check style with ruff
	$(VENV)/bin/ruff check src tests scripts hydra_plugins
	$(VENV)/bin/ruff format --check src tests scripts hydra_plugins

format: install-test  ## format the code with ruff
	$(VENV)/bin/ruff check --fix src tests scripts hydra_plugins
	$(VENV)/bin/ruff format src tests scripts hydra_plugins

clean:  ## remove logs and caches (never data/)
	rm -rf logs/* .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path "./$(VENV)/*" -exec rm -rf {} +
	touch logs/.gitkeep
