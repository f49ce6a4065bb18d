"""Issue 9 item 1: the server at 3x its capacity, open loop from the project's own load tester.

Model: `delay_mlp` with batch_ms = 20 and max_batch_size = 1, so one forward serves one request
and the capacity is known by construction: at most 1000 / 20 = 50 req/s (less on a busy
machine, where each forward also costs the net itself and thread switches). We offer 150 req/s.

Promises checked: every request is answered (200, 429 with Retry-After, or 504) — the load
tester's count of requests equals its count of answers, with no timeouts, refused or reset
connections; the process stays up; accepted requests' p99 stays within the bound below; and
after the load stops, single-request latency is back at its baseline within seconds. The
queue bound itself is held by the server's own measure: its `scalelab_queue_depth` gauge, read
from /metrics throughout the run, never above max_queue_size + 1 (the job being batched).

The latency bound for accepted requests: a request is admitted only while fewer than
max_queue_size (8) are queued, so it waits for at most 8 forwards plus its own: 9 x 20 ms =
180 ms on an idle machine. The server enforces the deadline (default_timeout_ms = 1000) on
queued requests independently of machine speed: one still queued at its deadline is answered
504 before compute, so an accepted one finishes within deadline + one forward. We assert the
latter plus 250 ms of slack for the generator and event loop on a loaded 2-core machine, and
report the queue-derived figure beside it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import (
    ANSWERED,
    LONG,
    Server,
    add_model,
    infer_body,
    median_single_ms,
    run_load,
    start_server,
)

pytestmark = pytest.mark.reliability

BATCH_MS = 20.0
QUEUE = 8
DEADLINE_MS = 1000.0
CAPACITY_RPS = 1000.0 / BATCH_MS
RATE = 3 * CAPACITY_RPS
DURATION_S = 20 if LONG else 3
SLACK_MS = 250.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("repo")
    add_model(root, "delay", {1: 3}, arch="delay_mlp",
              extra_params={"batch_ms": BATCH_MS, "row_ms": 0}, max_batch_size=1,
              dynamic_batching={"max_queue_size": QUEUE, "max_queue_delay_ms": 1,
                                "default_timeout_ms": DEADLINE_MS})
    add_model(root, "flights", {1: 1})
    log = tmp_path_factory.mktemp("log") / "server.log"
    srv = start_server(root, log)
    yield srv
    srv.stop()


def _side_requests(url: str, out: list[httpx.Response], stop: threading.Event) -> None:
    """While the load runs: bursts of concurrent requests from another client, to read the
    headers the load tester does not report (Retry-After on 429)."""
    with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=20)) as c:
        while not stop.is_set() and len(out) < 200:
            threads = [threading.Thread(target=lambda: out.append(
                c.post(f"{url}/v2/models/delay/infer", json=infer_body(1)))) for _ in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()


def _queue_depths(url: str, out: list[float], stop: threading.Event) -> None:
    """While the load runs: the server's own queue depth (`scalelab_queue_depth` of the delay
    model, from /metrics by Prometheus's parser), as often as it answers."""
    from prometheus_client.parser import text_string_to_metric_families

    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            text = c.get(f"{url}/metrics").text
            for fam in text_string_to_metric_families(text):
                if fam.name == "scalelab_queue_depth":
                    out += [s.value for s in fam.samples if s.labels.get("model") == "delay"]
            time.sleep(0.005)


def test_three_times_capacity_every_request_answered(server: Server) -> None:
    url = server.url
    with httpx.Client(timeout=30) as client:
        for _ in range(5):  # warm-up: the first forward of a fresh model is slow
            median_single_ms(url, "delay", client, n=1)
        baseline = median_single_ms(url, "delay", client)

        side: list[httpx.Response] = []
        stop = threading.Event()
        depths: list[float] = []
        t = threading.Thread(target=_side_requests, args=(url, side, stop))
        watch = threading.Thread(target=_queue_depths, args=(url, depths, stop))
        t.start()
        watch.start()
        try:
            level = run_load(url, "delay", "--rate", str(RATE), "--duration", f"{DURATION_S}s",
                             "--warmup", "0s", "--arrival", "constant", "--timeout", "30s")
        finally:
            stop.set()
            t.join()
            watch.join()

        # count sent == count answered: every failure is an HTTP status, and only 429 / 504
        sent = level["requests"]
        assert sent == int(RATE * DURATION_S)
        kinds = level["errors_by_kind"]
        assert set(kinds) <= ANSWERED, f"unanswered requests: {kinds}"
        answered = level["successes"] + sum(kinds.values())
        assert answered == sent
        assert set(level["errors_by_status"]) <= {"429", "504"}, level["errors_by_status"]
        assert level["errors_by_status"].get("429", 0) > 0, "3x capacity never filled the queue"
        assert level["successes"] > 0

        # the side client saw the same: 200, 429 with Retry-After, or 504
        assert side
        for r in side:
            assert r.status_code in (200, 429, 504), (r.status_code, r.text)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1

        # The promise itself, by the server's own measure rather than by wall time: its queue
        # never held more than max_queue_size jobs plus the one being batched, and at 3x
        # capacity it was full (so a queue admitting more would have shown it).
        assert len(depths) > 20 and max(depths) <= QUEUE + 1, (len(depths), max(depths))
        assert max(depths) >= QUEUE, sorted(depths)[-5:]
        # accepted requests' p99 within deadline + one forward (+ slack, see the docstring)
        p99 = level["latency"]["p99_ms"]
        queue_bound = (QUEUE + 1) * BATCH_MS
        bound = DEADLINE_MS + BATCH_MS + SLACK_MS
        assert p99 <= bound, (f"accepted p99 {p99:.1f} ms > {bound:.0f} ms "
                              f"(queue-derived bound on an idle machine: {queue_bound:.0f} ms)")
        # throughput never exceeds what the serial section allows
        assert level["throughput_rps"] <= CAPACITY_RPS * 1.1

        # the process is up, its other model unaffected
        assert server.proc.poll() is None
        assert client.get(f"{url}/v2/health/ready").status_code == 200
        assert client.post(f"{url}/v2/models/flights/infer",
                           json=infer_body(1)).status_code == 200

        # latency back to baseline within seconds (bounded poll, not a sleep)
        target = max(3 * baseline, baseline + 50.0)
        t0 = time.monotonic()
        recovered = None
        while time.monotonic() - t0 < 10.0:
            now = median_single_ms(url, "delay", client, n=3)
            if now <= target:
                recovered = time.monotonic() - t0
                break
        assert recovered is not None, f"latency {now:.1f} ms not back to baseline " \
                                      f"{baseline:.1f} ms after 10 s"
        print(f"\noverload {RATE:.0f} req/s x {DURATION_S}s: sent {sent}, "
              f"200 {level['successes']}, by status {level['errors_by_status']}, "
              f"p99 accepted {p99:.1f} ms (bound {bound:.0f}, queue-derived {queue_bound:.0f}), "
              f"throughput {level['throughput_rps']:.1f} req/s, baseline {baseline:.1f} ms, "
              f"recovered in {recovered:.2f} s")
    # the server log holds no traceback
    assert "Traceback" not in server.logs()


@pytest.mark.skipif(not LONG, reason="long form only (SCALELAB_LONG=1)")
def test_overload_from_two_generator_processes(server: Server) -> None:
    """Two generator processes at once (the tester's --processes): the same accounting."""
    level = run_load(server.url, "delay", "--rate", str(RATE), "--duration", "2s",
                     "--warmup", "0s", "--processes", "2", "--timeout", "30s")
    kinds = level["errors_by_kind"]
    assert set(kinds) <= ANSWERED, kinds
    assert level["successes"] + sum(kinds.values()) == level["requests"] == int(RATE * 2)
    assert server.proc.poll() is None
