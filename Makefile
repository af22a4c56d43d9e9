# phaserunner: `make demo` runs the example offline; `make test` sets up .venv and runs every check.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test lint typecheck pytest demo bench chaos format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check .

typecheck: install
	$(VENV)/bin/mypy

pytest: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test: lint typecheck pytest

demo: install
	$(PY) examples/support_agent.py $(ARGS)

bench: install
	$(PY) bench/run.py $(ARGS)

chaos: install
	$(PY) bench/chaos.py $(ARGS)

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
