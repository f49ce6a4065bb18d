"""The retrieval bench's fixed-rate latency run sized to what its latency objective needs: the
questions sent again until that many latencies (bench.open_loop), and the diagnose stage asking
for as many as its share of the budget pays (exact numbers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scalelab.core.errors import BadUsageError
from scalelab.diagnose.config import load_config
from scalelab.diagnose.schema import Prices
from scalelab.diagnose.stages.base import Context
from scalelab.diagnose.stages.retrieval import STAGE, latency_needed
from scalelab.diagnose.steps import StepResult
from scalelab.retrieval.bench import RetrievalBenchConfig, open_loop
from scalelab.retrieval.index import build_index


def test_the_latency_run_sends_the_questions_again_until_it_has_enough() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 16)).astype(np.float32)
    q = rng.standard_normal((30, 16)).astype(np.float32)
    index = build_index("exact", x)
    assert open_loop(index, q, 10, 5000.0)["queries"] == 30  # one pass
    assert open_loop(index, q, 10, 5000.0, 75)["queries"] == 75  # 2½ passes
    assert open_loop(index, q, 10, 5000.0, 10)["queries"] == 30  # never under one pass
    with pytest.raises(BadUsageError, match="--latency-queries"):
        RetrievalBenchConfig(latency_queries=-1)


def _ctx(tmp_path: Path, shares: dict[str, float], full: bool = False) -> Context:
    def never(*_: object) -> StepResult:
        raise AssertionError("no step runs here")

    return Context(work=tmp_path, logs=tmp_path, repeats=1, prices=Prices(), settings={},
                   run=never, fail=never, shares=shares, full=full)


def test_the_stage_asks_for_what_its_share_pays(tmp_path: Path) -> None:
    """Defaults: p99 ≤ 20 ms needs 299 latencies; 100 questions; 4 levels × (exact numpy,
    faiss Flat, HNSW, IVF-PQ) = 16 latency runs at 100 queries/s; the minimum is 76 s."""
    s = load_config(None, "default").stages.retrieval
    assert latency_needed(s.built_objectives()) == 299
    assert STAGE.latency_queries(s, _ctx(tmp_path, {})) is None  # no budget: one pass
    assert STAGE.latency_queries(s, _ctx(tmp_path, {}, full=True)) == 299
    assert STAGE.latency_queries(s, _ctx(tmp_path, {"retrieval": 76.0})) is None  # no spare
    # 16 s spare × 100 queries/s over 16 runs: 100 more each
    assert STAGE.latency_queries(s, _ctx(tmp_path, {"retrieval": 92.0})) == 200
    assert STAGE.latency_queries(s, _ctx(tmp_path, {"retrieval": 500.0})) == 299
