# One-command set-up: `make run` (main job) and `make test` (test suite) each
# create the virtual environment on first use.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run lint test test-fast bench clean

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

# ruff: lint + format check (pyproject's [tool.ruff]; `pre-commit install` runs it on every commit)
lint: setup
	$(BIN)/ruff check src tests benchmarks experiments
	$(BIN)/ruff format --check src tests benchmarks experiments

test: lint
	$(BIN)/pytest -q $(ARGS)

# Skips tests marked @pytest.mark.slow (real-process kill/resume runs and the like).
test-fast: lint
	$(BIN)/pytest -q -m "not slow" $(ARGS)

clean:
	rm -rf $(VENV) runs build *.egg-info
