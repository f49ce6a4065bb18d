"""The generator against real servers on 127.0.0.1 (tests/load/servers.py).

The machine these run on is shared and often oversubscribed, so bounds leave room for scheduler
noise; what they check is the behaviour (a stall visible or hidden, a rate held, lag flagged).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scalelab.load.connection import Target, build_request
from scalelab.load.generator import EngineConfig, Mode
from scalelab.load.histogram import LatencyHistogram
from scalelab.load.multiproc import LoadPlan, run_load
from scalelab.load.result import LoadResult


def _run(url: str, *, mode: Mode = "open", rate: float | None = None, concurrency: int = 1,
         duration_s: float | None = None, requests: int | None = None, warmup_s: float = 0.0,
         timeout_s: float = 10.0, processes: int = 1, max_connections: int = 1024,
         path: str | None = None) -> LoadResult:
    target = Target.parse(url + (path or "/"))
    req = build_request(target, method="GET", path=target.path, body=None)
    cfg = EngineConfig(target=target, requests=[req], mode=mode, concurrency=concurrency,
                       warmup_s=warmup_s, timeout_s=timeout_s, max_connections=max_connections)
    return run_load(LoadPlan(engine=cfg, rate=rate, duration_s=duration_s, requests=requests,
                             processes=processes))


def test_fixed_service_time_gives_p50_near_20ms(server: Callable[..., str]) -> None:
    url = server("fixed", "--service-ms", "20")
    for r in (_run(url, rate=100, duration_s=2.0, warmup_s=0.3),
              _run(url, mode="closed", concurrency=4, duration_s=2.0, warmup_s=0.3)):
        assert r.failures == 0 and r.successes > 100
        assert r.latency.p50_ms is not None
        # 20 ms of service + loopback + timer slack; never less than the service time.
        assert 19.9 <= r.latency.p50_ms <= 30.0
        assert r.cold_start_ms is not None and r.cold_start_ms >= 19.9
        assert r.warmup_requests > 0


def test_open_loop_shows_a_stall_that_closed_loop_hides(server: Callable[..., str]) -> None:
    # The server freezes 1 s in every 4 s; 6 s of load always covers a whole freeze.
    url = server("stall", "--service-ms", "5", "--period-s", "4", "--stall-s", "1")
    open_ = _run(url, rate=100, duration_s=6.0)
    closed = _run(url, mode="closed", concurrency=4, duration_s=6.0)
    assert open_.latency.max_ms is not None and closed.latency.max_ms is not None
    # Both saw the freeze...
    assert open_.latency.max_ms > 500 and closed.latency.max_ms > 500
    # ...but in open loop everything due during it waited (>= 1/6 of requests), so p99 is
    # most of the freeze; closed loop sent one request per client into it among thousands.
    assert open_.latency.p99_ms is not None and open_.latency.p99_ms > 500
    assert closed.latency.p99_ms is not None and closed.latency.p99_ms < 100
    assert open_.latency.p90_ms is not None and open_.latency.p90_ms > 100


def test_a_reachable_rate_is_held_within_2_percent(server: Callable[..., str]) -> None:
    url = server("fast")
    r = _run(url, rate=500, duration_s=3.0, warmup_s=0.2)
    assert r.requests == 1500
    assert r.sent_rps == pytest.approx(500, rel=0.02)
    assert r.throughput_rps == pytest.approx(500, rel=0.02)
    assert r.failures == 0


def test_generator_lag_is_detected_when_the_rate_is_unreachable(
        server: Callable[..., str]) -> None:
    url = server("fast")
    r = _run(url, rate=200_000, requests=30_000, max_connections=64)
    assert r.lag_count > 0 and r.lag_share > 0.05
    assert not r.valid and "generator lag" in r.invalid_reasons[0]
    assert r.sent_rps < 200_000 * 0.98


def test_errors_by_status_and_kind(server: Callable[..., str]) -> None:
    url = server("fast")
    r = _run(url, rate=200, requests=40, path="/status/503")
    assert r.errors_by_status == {"503": 40} and r.errors_by_kind == {"status": 40}
    assert r.successes == 0 and r.failure_rate == 1.0
    r = _run(url, rate=200, requests=20, path="/reset")
    assert r.errors_by_kind == {"reset": 20}
    slow = server("fixed", "--service-ms", "2000")
    r = _run(slow, rate=50, requests=10, timeout_s=0.2)
    assert r.errors_by_kind == {"timeout": 10}


def test_refused_connections_are_counted(server: Callable[..., str]) -> None:
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _run(f"http://127.0.0.1:{port}", rate=100, requests=10)
    assert r.errors_by_kind == {"refused": 10}
    assert r.cold_start_error is not None


def test_two_processes_split_the_schedule_and_merge(server: Callable[..., str]) -> None:
    url = server("fast")
    r = _run(url, rate=400, duration_s=2.0, processes=2)
    assert r.processes == 2
    assert r.requests == 800 and r.successes == 800
    assert LatencyHistogram.decode(r.hist_blob).count == 800
    assert r.sent_rps == pytest.approx(400, rel=0.02)
