# Two commands do everything on a fresh machine:
#   make demo   set up .venv, pull the embedded default models, run the short benchmark
#   make test   set up .venv and run the whole test suite (pulls the models it needs)
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/draftsman bench --preset demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV)
