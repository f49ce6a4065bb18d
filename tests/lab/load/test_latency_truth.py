"""The load testers' latencies against what the server itself did, with due and sent times apart.

The coordinated-omission guarantee: an open loop times each request from when it was *due*, so
the time a request spends waiting for a connection (every one busy at `--max-connections`
behind a server that stalls on purpose) counts in its latency. Each request here carries its
index in the schedule (`?i=<k>`, or "i=<k>" in an LLM prompt); the server writes down when it
read each request and wrote its answer (GET /truth, on time.monotonic, the clock the tester
reads), and the test, knowing the schedule, computes each request's true latency from its due
time. The tester's p50/p95/p99 must match those to the histogram's precision, plus the loopback
and the client's measured starvation (`llmkit.StallWatch`) above, never below. A tester that
timed from the actual send would read the wait away and fall below the truth at p95 and p99.

Closed loop has no due time: a client sends when its previous answer came, so the truth is the
server's read-to-write time, and the stall shows as one slow sample per client.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Sequence

import pytest

from llmkit import JITTER_MS, StallWatch, llm_server, quantile_bounds
from scalelab.lab.load.histogram import Percentiles
from scalelab.lab.load.http.generator import HttpConfig
from scalelab.lab.load.http.run import LoadPlan, run_load
from scalelab.lab.load.llm.run import LlmPlan, run_llm
from scalelab.lab.load.llm.stream import StreamConfig
from scalelab.lab.load.schedule import Mode
from scalelab.lab.load.send import Target, build_request

PREC = 0.999  # HdrHistogram at 3 significant digits reads within 0.1% of the sample
RATE = 200.0
N = 320  # 1.6 s at 200/s: covers one whole freeze of the servers (0.3 s in every 1 s)
SSE_RATE, SSE_N = 60.0, 96  # 1.6 s of streams
# Closed loop: as many requests as its clients send in about 1.7 s (4 x 10 ms answers, 4 x 35 ms
# streams), so the run covers a whole freeze too.
CLOSED_N, SSE_CLOSED_N = 700, 200


def _truth(url: str) -> dict[str, list[float]]:
    with urllib.request.urlopen(url + "/truth", timeout=10) as r:
        out: dict[str, list[float]] = json.loads(r.read())
    return out


def _due_times(index: Sequence[float], arrival: Sequence[float]) -> list[float]:
    """Each request's due time on the server's clock: the schedule (k / RATE) from the origin
    the earliest request allows (no request can arrive before it is due, so the origin is at
    most the earliest arrival less its offset: an origin estimated late by the first request's
    send and loopback, which makes each truth shorter, never longer)."""
    t0 = min(a - k / RATE for k, a in zip(index, arrival, strict=True))
    return [t0 + k / RATE for k in index]


def _assert_matches(got: Percentiles, truth_ms: list[float], slack_ms: float) -> None:
    """p50/p95/p99 of the tester's histogram against the order statistics of the truth: at least
    the truth (to the histogram's 0.1%), above it by the loopback and the client's lag at most."""
    assert got.count == len(truth_ms)
    for q, value in ((0.5, got.p50_ms), (0.95, got.p95_ms), (0.99, got.p99_ms)):
        lo, hi = quantile_bounds(truth_ms, q, len(truth_ms))
        assert value is not None
        assert lo * PREC <= value <= (hi + slack_ms) / PREC, (q, value, lo, hi, slack_ms)


def _http(url: str, mode: Mode, **kw: object) -> Percentiles:
    n = N if mode == "open" else CLOSED_N
    target = Target.parse(url + "/")
    reqs = [build_request(target, method="GET", path=f"/?i={k}", body=None) for k in range(n)]
    cfg = HttpConfig(target=target, requests=reqs, mode=mode, timeout_s=10.0,
                     **kw)  # type: ignore[arg-type]
    r = run_load(LoadPlan(engine=cfg, rate=RATE if mode == "open" else None,
                          requests=n, cold_start=False, processes=1))
    assert r.failures == 0 and r.successes == n
    return r.latency


def test_http_open_loop_latency_includes_the_wait_for_a_connection(
        server: Callable[..., str]) -> None:
    # 4 connections at 10 ms answer 400/s; a 0.3 s freeze holds all four, and the requests due
    # meanwhile (~60) wait in the tester's queue, then drain at the 200/s to spare.
    url = server("stall", "--service-ms", "10", "--period-s", "1", "--stall-s", "0.3")
    watch = StallWatch().start()
    got = _http(url, "open", max_connections=4)
    slack = JITTER_MS + watch.stop()
    t = _truth(url)
    assert sorted(t["index"]) == list(range(N))
    due = _due_times(t["index"], t["arrival_s"])
    truth = [(d - s) * 1e3 for d, s in zip(t["done_s"], due, strict=True)]
    # The wait is there to be measured: well past the service time at p95, at it at p50.
    assert max(truth) > 200 and sorted(truth)[int(0.95 * N)] > 50
    _assert_matches(got, truth, slack)


def test_http_closed_loop_latency_is_the_servers_own(server: Callable[..., str]) -> None:
    url = server("stall", "--service-ms", "10", "--period-s", "1", "--stall-s", "0.3")
    watch = StallWatch().start()
    got = _http(url, "closed", concurrency=4, max_connections=4)
    slack = JITTER_MS + watch.stop()
    t = _truth(url)
    truth = [(d - a) * 1e3 for a, d in zip(t["arrival_s"], t["done_s"], strict=True)]
    assert len(truth) == CLOSED_N and max(truth) > 200  # a client sat through a freeze
    _assert_matches(got, truth, slack)


def _llm(url: str, mode: Mode, **kw: object) -> tuple[Percentiles, Percentiles]:
    n = SSE_N if mode == "open" else SSE_CLOSED_N
    target = Target.parse(url + "/v1/chat/completions")
    bodies = [{"model": "test-llm", "stream": True, "max_tokens": 4,
               "messages": [{"role": "user", "content": f"hello i={k}"}],
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
              for k in range(n)]
    reqs = [build_request(target, method="POST", path=target.path,
                          body=json.dumps(b).encode(), headers={"Accept": "text/event-stream"})
            for b in bodies]
    cfg = StreamConfig(target=target, requests=reqs, mode=mode, timeout_s=10.0,
                       **kw)  # type: ignore[arg-type]
    r = run_llm(LlmPlan(stream=cfg, rate=SSE_RATE if mode == "open" else None,
                        requests=n, processes=1))
    assert r.failures == 0 and r.successes == n
    return r.ttft, r.e2e


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_sse_ttft_and_e2e_include_the_wait_for_a_stream(mode: Mode) -> None:
    # 4 tokens, one a chunk: first at 20 ms, last at 35 ms; 4 connections at the cap hold 114
    # streams/s against 60/s offered, so a 0.3 s freeze in every 1 s holds all four and the
    # streams due meanwhile and while the backlog drains (about a third of them) wait in the
    # tester's queue.
    with llm_server("--ttft-ms", "20", "--gap-ms", "5", "--stall-period-s", "1",
                    "--stall-s", "0.3") as url:
        watch = StallWatch().start()
        ttft, e2e = _llm(url, mode, max_connections=4, concurrency=4)
        slack = JITTER_MS + watch.stop()
        t = _truth(url)
    n = SSE_N if mode == "open" else SSE_CLOSED_N
    assert sorted(t["index"]) == (list(range(n)) if mode == "open" else sorted(t["index"]))
    assert len(t["index"]) == n
    if mode == "open":
        origin = min(a - k / SSE_RATE for k, a in zip(t["index"], t["arrival_s"], strict=True))
        start = [origin + k / SSE_RATE for k in t["index"]]
    else:
        start = t["arrival_s"]
    first = [(f - s) * 1e3 for f, s in zip(t["first_s"], start, strict=True)]
    last = [(e - s) * 1e3 for e, s in zip(t["last_s"], start, strict=True)]
    # Not vacuous: the freezes reach the timed spans. Open loop: streams due in a freeze wait
    # in the tester's queue, so their TTFT does. Closed loop: a stream in flight when a freeze
    # starts always ends after it, but none may be before its first token then (four streams
    # in step under a busy suite are all past it 15 ms of every 35 ms), so e2e is the check.
    assert max(first if mode == "open" else last) > 200
    _assert_matches(ttft, first, slack)
    _assert_matches(e2e, last, slack)
