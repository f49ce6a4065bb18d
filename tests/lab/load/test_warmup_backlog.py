"""An overloaded level's warm-up leaves a queue; the measured window must not read its drain as
lost capacity (tests/lab/load/servers.py's `queue` server: FIFO, 10 ms each, exactly 100/s)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scalelab.lab.load.http.generator import HttpConfig
from scalelab.lab.load.http.result import LoadResult
from scalelab.lab.load.http.run import LoadPlan, run_load
from scalelab.lab.load.send import Target, build_request

CAPACITY = 100.0
"""Requests/s of the queue server at 10 ms a request (its virtual clock does not drift)."""


def _open(url: str, rate: float, *, warmup_s: float) -> LoadResult:
    target = Target.parse(url + "/")
    req = build_request(target, method="GET", path=target.path, body=None)
    cfg = HttpConfig(target=target, requests=[req], mode="open", warmup_s=warmup_s)
    return run_load(LoadPlan(engine=cfg, rate=rate, duration_s=2.0))


def test_an_overloaded_level_reads_the_capacity_despite_the_warmups_backlog(
        server: Callable[..., str]) -> None:
    url = server("queue", "--service-ms", "10")
    # 160/s for a 1 s warm-up leaves ~60 requests queued when the window opens; the 320
    # measured ones wait behind them, so their own completions span 3.8 s, not 3.2 s.
    r = _open(url, 160.0, warmup_s=1.0)
    assert r.failures == 0 and r.requests == 320
    assert r.throughput_rps == pytest.approx(CAPACITY, rel=0.10)
    # What the measured requests alone would say: the backlog's drain read as capacity lost.
    assert r.successes / r.wall_s < 0.9 * CAPACITY


def test_a_level_under_capacity_reads_its_offered_rate(server: Callable[..., str]) -> None:
    url = server("queue", "--service-ms", "10")
    r = _open(url, 50.0, warmup_s=0.5)
    assert r.failures == 0 and r.requests == 100
    assert r.throughput_rps == pytest.approx(50.0, rel=0.10)

