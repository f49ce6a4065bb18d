"""An open-loop streaming level past its server's capacity reads that capacity: what the server
finished inside the measured window, the warm-up's backlog included (load/llm/window.py), not
the measured requests' successes over the longer span their wait behind the backlog took.
The truth is exact on the deterministic test server (tests/lab/load/llm_server.py): 4 slots,
20 ms to the first token, then 7 gaps of 10 ms for 8 tokens hold a slot 90 ms, so it serves
4 / 0.09 = 44.4 requests/s and 355.6 output tokens/s, whatever the offered rate above that."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmkit import llm_server
from scalelab.lab.load.llm.run import LlmPlan, run_llm
from scalelab.lab.load.llm.stream import StreamConfig
from scalelab.lab.load.llm.workload import LengthDist, Workload
from scalelab.lab.load.send import Target

RPS = 4 / 0.090
TPS = RPS * 8


@pytest.fixture
def url() -> Iterator[str]:
    with llm_server("--max-streams", "4", "--ttft-ms", "20", "--gap-ms", "10") as u:
        yield u


def _plan(url: str, rate: float, warmup_s: float, *, requests: int | None = None,
          duration_s: float | None = None) -> LlmPlan:
    t = Target.parse(url + "/v1/chat/completions")
    reqs = Workload(output=LengthDist(kind="fixed", a=8), distinct=4).build(t)
    return LlmPlan(stream=StreamConfig(target=t, requests=reqs, mode="open",
                                       warmup_s=warmup_s, timeout_s=30.0),
                   rate=rate, requests=requests, duration_s=duration_s)


def test_an_overloaded_open_level_reads_the_servers_capacity(url: str) -> None:
    # 80/s offered for a 1 s warm-up leaves ~36 requests queued; the 2 s window's 160 measured
    # requests finish only ~4.4 s after it opens.
    r = run_llm(_plan(url, 80.0, 1.0, requests=160))
    assert (r.successes, r.failures, r.output_tokens) == (160, 0, 160 * 8)
    assert r.warmup_requests == 80
    # Served inside the 2 s window: every slot busy throughout (±2 requests at its edges).
    assert RPS * 0.93 <= r.throughput_rps <= RPS * 1.03
    assert TPS * 0.93 <= r.output_tps <= TPS * 1.03
    # What the level read before: the measured successes over their own span, the backlog's
    # drain included (~36/s, a plateau read as a decline).
    assert r.successes / r.wall_s < RPS * 0.9


def test_a_step_stopped_early_counts_up_to_its_stop(url: str) -> None:
    # As `load llm capacity` runs a step (capacity() passes its stop rule as stop_check): open
    # loop for at most --max-step, stopped once decided; here the rule stops it after 1.5 s
    # measured, half its 3 s, and the window ends there.
    r = run_llm(_plan(url, 80.0, 0.5, duration_s=3.0),
                stop_check=lambda part, elapsed: elapsed >= 1.5)
    assert r.stopped_early and r.failures == 0
    assert RPS * 0.9 <= r.throughput_rps <= RPS * 1.05
    assert TPS * 0.9 <= r.output_tps <= TPS * 1.05
    assert r.successes / r.wall_s < RPS * 0.9
