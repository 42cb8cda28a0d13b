# Set-up and everyday commands. `make train` and `make test` do the whole set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Re-install only when the dependency files change.
STAMP := $(VENV)/.installed
# The pinned versions `make install` uses; `make test LOCK=` installs the newest that pyproject.toml allows.
LOCK ?= requirements.lock

.PHONY: help install train test test-fast bench lint format clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e ".[dev]" $(if $(LOCK),-c $(LOCK))
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the project with the pinned dependencies

train: install  ## train with the default config (offline MNIST digits) and print the test metrics
	$(PY) src/train.py

test: install  ## run the whole test suite (what CI runs)
	$(PY) -m pytest -n 2 --dist worksteal

test-fast: install  ## run the tests not marked slow
	$(PY) -m pytest -n 2 --dist worksteal -m "not slow"

bench: install  ## measure the template against hand-written PyTorch loops (scripts/benchmark.py; a few minutes)
	$(PY) scripts/benchmark.py

lint: install  ## check style with ruff
	$(VENV)/bin/ruff check src tests scripts hydra_plugins
	$(VENV)/bin/ruff format --check src tests scripts hydra_plugins

format: install  ## format the code with ruff
	$(VENV)/bin/ruff check --fix src tests scripts hydra_plugins
	$(VENV)/bin/ruff format src tests scripts hydra_plugins

clean:  ## remove logs and caches (never data/)
	rm -rf logs/* .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path "./$(VENV)/*" -exec rm -rf {} +
	touch logs/.gitkeep
