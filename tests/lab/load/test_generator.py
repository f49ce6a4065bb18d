"""The generator against real servers on 127.0.0.1 (tests/lab/load/servers.py).

The machine these run on is shared and often oversubscribed, so bounds leave room for scheduler
noise; what they check is the behaviour (a stall visible or hidden, a rate held, lag flagged).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from llmkit import JITTER_MS, StallWatch, quantile_bounds
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.http.generator import HttpConfig
from scalelab.lab.load.http.result import LoadResult
from scalelab.lab.load.http.run import LoadPlan, run_load
from scalelab.lab.load.schedule import Mode
from scalelab.lab.load.send import Target, build_request


def _run(url: str, *, mode: Mode = "open", rate: float | None = None, concurrency: int = 1,
         duration_s: float | None = None, requests: int | None = None, warmup_s: float = 0.0,
         timeout_s: float = 10.0, processes: int = 1, max_connections: int = 1024,
         path: str | None = None, realtime: bool = False) -> LoadResult:
    target = Target.parse(url + (path or "/"))
    req = build_request(target, method="GET", path=target.path, body=None)
    cfg = HttpConfig(target=target, requests=[req], mode=mode, concurrency=concurrency,
                       warmup_s=warmup_s, timeout_s=timeout_s, max_connections=max_connections,
                       realtime=realtime)
    return run_load(LoadPlan(engine=cfg, rate=rate, duration_s=duration_s, requests=requests,
                             processes=processes))


def test_fixed_service_time_gives_p50_near_20ms(server: Callable[..., str]) -> None:
    url = server("fixed", "--service-ms", "20")
    runs = []
    seen = 0
    for kw in ({"rate": 100}, {"mode": "closed", "concurrency": 4}):
        watch = StallWatch().start()
        r = _run(url, duration_s=1.0, warmup_s=0.3, path="/?i=0", **kw)  # type: ignore[arg-type]
        slack = JITTER_MS + watch.stop()
        truth = _server_times(url)[seen:]
        seen += len(truth)
        runs.append((r, truth, slack))
    open_, closed = runs[0][0], runs[1][0]
    assert open_.requests == open_.successes == 100
    for r, truth, slack in runs:
        assert r.failures == 0 and r.successes >= 50
        assert r.latency.p50_ms is not None
        # never less than the service time, and above what the server itself took (its read
        # of the request to its write of the answer, warm-up and cold start included) only by
        # the loopback and this client's measured starvation
        assert r.latency.p50_ms >= 19.9
        lo, hi = quantile_bounds(truth, 0.5, r.successes)
        assert lo * 0.999 <= r.latency.p50_ms <= (hi + slack) / 0.999, (r.latency, lo, hi)
        assert r.cold_start_ms is not None and r.cold_start_ms >= 19.9
        assert r.warmup_requests > 0
    # Little's law: 4 closed-loop clients keep 4 requests in flight, so throughput x mean
    # latency is 4 whatever the machine's speed; a latency measured too long (or throughput
    # counted short) breaks it. The clients' own turnaround between a response and the next
    # send is the slack below 4.
    assert closed.latency.mean_ms is not None
    assert 4 * 0.9 <= closed.throughput_rps * closed.latency.mean_ms / 1e3 <= 4 * 1.02


def _server_times(url: str) -> list[float]:
    """The test server's own read-to-write time of every request so far (ms, GET /truth)."""
    import json
    import urllib.request

    with urllib.request.urlopen(url + "/truth", timeout=10) as f:
        t = json.loads(f.read())
    return [(d - a) * 1e3 for a, d in zip(t["arrival_s"], t["done_s"], strict=True)]


def test_open_loop_shows_a_stall_that_closed_loop_hides(server: Callable[..., str]) -> None:
    # The server freezes 0.6 s in every 2 s; 3 s of load always covers a whole freeze.
    url = server("stall", "--service-ms", "5", "--period-s", "2", "--stall-s", "0.6")
    open_ = _run(url, rate=100, duration_s=3.0)
    closed = _run(url, mode="closed", concurrency=4, duration_s=3.0)
    assert open_.latency.max_ms is not None and closed.latency.max_ms is not None
    # Both saw the freeze...
    assert open_.latency.max_ms > 500 and closed.latency.max_ms > 500
    # ...but in open loop everything due during it waited: at least the 0.1 s of arrivals
    # (1/30 of them) due in a freeze's first 100 ms waited > 500 ms, so p99 is in the freeze,
    # and the 0.5 s due in its first 500 ms (1/6) waited > 100 ms; closed loop sent one
    # request per client into each freeze among about two thousand (under 1%).
    assert open_.latency.p99_ms is not None and open_.latency.p99_ms > 500
    assert closed.latency.p99_ms is not None and closed.latency.p99_ms < 500
    assert open_.latency.p90_ms is not None and open_.latency.p90_ms > 100


def test_a_reachable_rate_is_held_within_2_percent(server: Callable[..., str],
                                                   realtime_ok: bool) -> None:
    # Throughput counts what was served inside the window, the warm-up's backlog included: a
    # server or generator stalled through the 0.2 s warm-up on a busy machine answers all its
    # 100 requests in the window (1,600 / 3 s = 533 req/s). Both in SCHED_FIFO where allowed.
    url = server("fast", realtime=realtime_ok)
    r = _run(url, rate=500, duration_s=3.0, warmup_s=0.2, realtime=realtime_ok)
    assert r.requests == 1500
    assert r.sent_rps == pytest.approx(500, rel=0.02)
    assert r.throughput_rps == pytest.approx(500, rel=0.02)
    assert r.failures == 0


def test_a_rate_beyond_reach_is_invalid_with_the_reason(server: Callable[..., str]) -> None:
    # Four connections to a 20 ms server carry at most 200 req/s: at 1,000 req/s nearly every
    # request waits for a connection while the generator itself idles (it waits for a core a
    # few % of the run even at load 5 on 2 cores), so the fix names the cap, not the CPU.
    url = server("fixed", "--service-ms", "20")
    r = _run(url, rate=1000, requests=300, max_connections=4)
    assert r.lag_count > 0 and r.lag_p99_ms is not None and r.lag_p99_ms > 2.0
    assert not r.valid and r.invalid_reasons[0].startswith("generator fell behind")
    assert r.generator_cpu is not None and not r.generator_cpu.starved(1), r.generator_cpu
    assert r.pool_waits > 250
    assert r.invalid_reasons[0].endswith(
        f"{r.pool_waits} requests waited for a free connection: raise --max-connections")
    assert r.sent_rps < r.scheduled_rps * 0.98


def test_a_level_far_below_capacity_is_valid_and_reports_lag(
        server: Callable[..., str], realtime_ok: bool) -> None:
    # 50 req/s is ~1% of what one generator process offers; its 20 ms gaps leave lag far
    # inside every limit (the 40 req/s level was flagged by an older rule). In its
    # precise mode where the machine allows it: a CI run flagged this level with the other
    # test worker busy (1.37 of 2 cores; the generator waited for a core 4% of the run), and
    # a normal generator that waits for a core past a 20 ms gap is rightly flagged for it.
    url = server("fixed", "--service-ms", "10")
    r = _run(url, rate=50, duration_s=2.0, warmup_s=0.2, realtime=realtime_ok)
    assert r.requests == 100 and r.failures == 0
    assert r.invalid_reasons == [] and r.valid  # a failure shows the reasons, not a repr
    assert r.lag_p50_ms is not None and r.lag_p99_ms is not None and r.lag_max_ms >= 0
    assert r.lag_p50_ms <= r.lag_p99_ms <= r.lag_max_ms


def test_a_default_mode_level_is_judged_by_its_own_lag(server: Callable[..., str]) -> None:
    # The default (not realtime) generator at the same far-below-capacity level. Whether it
    # waited for a core past a gap depends on what else runs (CI runs two tests on two cores),
    # so the test asserts what does not: the verdict is the rule applied to what the level
    # measured — invalid exactly when the lag p99 passed one 20 ms gap or the sends fell more
    # than 2% short — and a flagged level blames the generator (and offers --realtime), never
    # the connection pool or the server.
    url = server("fixed", "--service-ms", "10")
    r = _run(url, rate=50, duration_s=1.0, warmup_s=0.1)
    assert r.requests == 50 and r.failures == 0 and r.pool_waits == 0
    assert r.lag_p99_ms is not None
    late = r.lag_p99_ms > 20.0
    behind = r.sent_rps < r.scheduled_rps * 0.98
    assert len(r.invalid_reasons) == late + behind, (r.lag_p99_ms, r.invalid_reasons)
    assert r.valid is (not late and not behind)
    for reason in r.invalid_reasons:
        assert reason.startswith(("generator lag p99", "generator fell behind")), reason
        assert "use --realtime" in reason and "--max-connections" not in reason, reason


_HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    pass
"""


def _starved(url: str, *, realtime: bool) -> LoadResult:
    # Six busy processes pinned to the generator's one core leave it a seventh of that core,
    # less than 2,000 req/s costs it; the hogs end by themselves after 20 s at the latest.
    old = os.sched_getaffinity(0)
    cpu = min(old)
    hogs = [subprocess.Popen([sys.executable, "-c", _HOG, str(cpu), "20"]) for _ in range(6)]
    try:
        os.sched_setaffinity(0, {cpu})
        return _run(url, rate=2000, duration_s=2.0, realtime=realtime)
    finally:
        os.sched_setaffinity(0, old)
        for h in hogs:
            h.kill()
            h.wait(timeout=10)


def test_a_generator_starved_of_cpu_is_invalid_with_the_reason(
        server: Callable[..., str]) -> None:
    r = _starved(server("fast"), realtime=False)
    assert not r.valid
    assert all(x.startswith(("generator fell behind", "generator lag p99"))
               for x in r.invalid_reasons), r.invalid_reasons
    # Whether it fell behind in its send loop or with every connection still busy (it read
    # the responses late), the measured cause is the CPU: it waited for a core most of the run.
    assert r.generator_cpu is not None and r.generator_cpu.starved(1), r.generator_cpu
    assert all("the generator was CPU-starved (" in x and "add --processes (now 1)" in x
               and "--max-connections" not in x for x in r.invalid_reasons), r.invalid_reasons


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
    # the cold-start probe met the same refusal, and there is no cold-start time to report
    assert r.cold_start_error is not None and r.cold_start_error.startswith(
        "ConnectionRefusedError:"), r.cold_start_error
    assert r.cold_start_ms is None and r.successes == 0


def test_two_processes_split_the_schedule_and_merge(server: Callable[..., str]) -> None:
    url = server("fast")
    r = _run(url, rate=400, duration_s=2.0, processes=2)
    assert r.processes == 2
    assert r.requests == 800 and r.successes == 800
    assert LatencyHistogram.decode(r.hist_blob).count == 800
    assert r.sent_rps == pytest.approx(400, rel=0.02)
