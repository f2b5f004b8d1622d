# Set-up and entry points. `make test` and `make demo` build .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
CONSTRAINTS := -c requirements/constraints.txt
STAMP := $(VENV)/.installed
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline
export DS_ACCELERATOR ?= cpu

.PHONY: install test demo clean-venv docs

install: $(STAMP)

$(STAMP): requirements/base.txt requirements/engine.txt requirements/test.txt requirements/constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" setuptools wheel
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q $(CONSTRAINTS) -r requirements/base.txt -r requirements/test.txt
	$(PIP) install -q $(CONSTRAINTS) --no-build-isolation -r requirements/engine.txt
	$(PIP) install -q $(CONSTRAINTS) --no-build-isolation --no-deps -e .
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n 2 -q tests

demo: $(STAMP)
	$(PY) tools/demo.py

docs: $(STAMP)
	$(PY) tools/gen_config_docs.py

clean-venv:
	rm -rf $(VENV)
