# `make demo` and `make test` work on a fresh clone: they build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --quiet --disable-pip-version-check
BASE_STAMP := $(VENV)/.base-installed
DEV_STAMP := $(VENV)/.dev-installed

.PHONY: demo test lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# The demo needs only the runtime dependencies (a quicker first run).
$(BASE_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	touch $@

# Tests and linters need the test servers (PostgreSQL, moto, the Kubernetes emulator) too.
$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[dev]'
	touch $@ $(BASE_STAMP)

demo: $(BASE_STAMP)
	$(BIN)/gpufed up --demo

# Debian packages some tests run for real; installed when root with apt, else those tests skip.
SYSTEM_PACKAGES := prometheus chromium fonts-liberation slurm-wlm munge

test: $(DEV_STAMP)
	@sh tools/system-packages.sh $(SYSTEM_PACKAGES)
	$(BIN)/pytest -q

lint: $(DEV_STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(DEV_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .gpufed
