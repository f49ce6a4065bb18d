"""A closed-loop level opens its window when the warm-up's streams have ended, so the level's
rate is the engine's steady one (tests/lab/load/llm_server.py: deterministic streams)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmkit import llm_server
from scalelab.lab.load.llm.run import LlmPlan, run_llm
from scalelab.lab.load.llm.stream import StreamConfig
from scalelab.lab.load.llm.workload import LengthDist, Workload
from scalelab.lab.load.send import Target


@pytest.fixture
def url() -> Iterator[str]:
    with llm_server("--ttft-ms", "20", "--gap-ms", "10") as u:
        yield u


def test_the_window_excludes_the_warmups_streams(url: str) -> None:
    t = Target.parse(url + "/v1/chat/completions")
    reqs = Workload(output=LengthDist(kind="fixed", a=24), distinct=4).build(t)
    plan = LlmPlan(stream=StreamConfig(target=t, requests=reqs, mode="closed", concurrency=4,
                                       warmup_s=0.1, timeout_s=20.0), requests=8)
    r = run_llm(plan)
    assert (r.successes, r.failures, r.output_tokens) == (8, 0, 8 * 24)
    # Each client's first stream (≥ 250 ms: 20 ms + 23 gaps of 10 ms) outlasts the 0.1 s
    # warm-up, so 4 warm-up streams are still running when it ends.
    assert r.warmup_requests == 4 and r.e2e.mean_ms is not None
    # Little's law: 4 clients keep 4 streams open, so requests/s × mean e2e is 4 whatever the
    # machine's speed. A window opened while the warm-up's streams still ran counts their
    # ≥ 150 ms tail as time without measured tokens: 2 rounds read over ≥ 650 ms (≤ 3.1).
    # Streams this long keep a busy machine's timer jitter small next to them.
    assert 4 * 0.9 <= r.throughput_rps * r.e2e.mean_ms / 1e3 <= 4 * 1.02
