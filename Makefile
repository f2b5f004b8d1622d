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

.PHONY: install help test test-fast demo demo-extension analysis-demo clean-venv docs gpu-check gpu-reproduce gpu-wheels

install: $(STAMP) ## build .venv: torch 2.13 (CPU), the requirements, kerple itself

help: ## list these targets
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): requirements/base.txt requirements/engine.txt requirements/test.txt requirements/eval.txt requirements/constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(CONSTRAINTS) --upgrade "pip>=24" setuptools wheel
	$(PIP) install -q $(CONSTRAINTS) torch
	$(PIP) install -q $(CONSTRAINTS) -r requirements/base.txt -r requirements/test.txt -r requirements/eval.txt
	$(PIP) install -q $(CONSTRAINTS) --no-build-isolation -r requirements/engine.txt
	$(PIP) install -q $(CONSTRAINTS) --no-build-isolation --no-deps -e .
	touch $(STAMP)

test: $(STAMP) ## the whole suite on CPU (GPU tests skip without CUDA)
	$(PY) -m pytest -n 2 -q tests

test-fast: $(STAMP) ## the unit tests that start no process and are not slow
	$(PY) -m pytest -n 2 -q -m "not process and not slow" tests/unit

demo: $(STAMP) ## KERPLE's extrapolation story on a CPU with embedded data
	$(PY) tools/demo.py

# PI and YaRN fine-tuned at 4x the train length beside KERPLE-log, ALiBi and rotary given the same steps
# (docs/context-extension.md); first trains the demo's base models that are missing or unfinished (a run
# trained for other steps or with another config is moved aside to <name>.stale-<time> and trained again)
demo-extension: $(STAMP) ## PI and YaRN fine-tuned beside the demo's models
	$(PY) tools/demo_extension.py $(EXTENSION_ARGS)

# receptive field, attention alignment, passkey retrieval and NoPE variance of `make demo`'s models;
# `make analysis-demo ANALYSIS_ARGS=--table41` also trains and analyses the thesis' Table 4.1 variants
analysis-demo: $(STAMP) ## receptive field, alignment, retrieval, NoPE of the demo's models
	$(PY) tools/analysis_demo.py $(ANALYSIS_ARGS)

docs: $(STAMP) ## regenerate the config reference
	$(PY) tools/gen_config_docs.py

clean-venv: ## remove .venv
	rm -rf $(VENV)

# `make gpu-check [QUICK=1 | PROFILE=1] [STEPS=3,4] [BUDGET=seconds] [OUTPUT=folder]`: the GPU check
# (tools/gpu_check.py) with the interpreter that holds torch: .venv here, the image's python3 on a GPU
# machine. QUICK=1: one short lease (steps 1, 3, 4 for the key embeddings, 540 s). PROFILE=1: step 8
# alone, where a 162M training step's time goes (150 s). Distributions the
# interpreter lacks, or has too old, are installed from .whl/ (`make gpu-wheels` where there is
# network) into GPU_SITE, offline; gpu_check.py does that itself when run without make.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_SITE ?= /tmp/kerple-gpu-site
STEPS ?= all
# shell lines shared by the GPU targets: install what the interpreter lacks from .whl/, offline
define GPU_SITE_SETUP
$(GPU_PYTHON) tools/gpu_wheels.py install $(GPU_SITE) || echo "make $@: going on without the missing distributions" >&2
endef

gpu-check: ## the GPU check (QUICK=1, PROFILE=1, STEPS=, BUDGET=, OUTPUT=)
	@$(GPU_SITE_SETUP); \
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(GPU_PYTHON) tools/gpu_check.py --steps "$(STEPS)" $(if $(QUICK),--quick) $(if $(PROFILE),--profile) \
	  $(if $(BUDGET),--budget $(BUDGET)) $(if $(OUTPUT),--output $(OUTPUT))

# `make gpu-reproduce [TOKENS=600M] [MINUTES=9] [SCALE=tiny] [REPRODUCE_ARGS=...]`: KERPLE Table 3 at
# 162M (tools/gpu_reproduce.py); each call works for at most MINUTES, the same call again continues.
# `make gpu-reproduce PRESET=lease OUTPUT=folder [MINUTES=9]`: one short reproduction sized to MINUTES,
# its report (4 files) in OUTPUT only.
gpu-reproduce: ## KERPLE Table 3 at 162M on a GPU (PRESET=lease, MINUTES=, TOKENS=)
	@$(GPU_SITE_SETUP); \
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(GPU_PYTHON) tools/gpu_reproduce.py $(if $(SCALE),--scale $(SCALE)) \
	  $(if $(PRESET),--preset $(PRESET)) $(if $(OUTPUT),--output $(OUTPUT)) \
	  $(if $(TOKENS),--tokens $(TOKENS)) $(if $(MINUTES),--minutes $(MINUTES)) $(REPRODUCE_ARGS)

gpu-wheels: $(STAMP) ## download the wheels a GPU image lacks into .whl/
	$(PY) tools/gpu_wheels.py download
