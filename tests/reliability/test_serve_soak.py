"""Issue 9 item 7: a long bounded run against one server process — resident memory grows less
than 5% after warm-up and less than 2 KiB a request, and no file descriptor leaks.

The load is the project's tester in closed loop (16 clients, each sending its next request when
the previous returns): a sustainable rate by construction, whatever the machine's speed, so the
run measures leaks and not overload. The server runs with the request sample on, rotating
small files, so file rotation is part of what must not leak.

Bounded form (default `make test`): 1,000 warm-up + 3,000 measured requests. Long form
(SCALELAB_LONG=1): 5,000 warm-up, then 9 minutes of requests (as many as the machine serves;
1,000,000 would need ~1,850 req/s sustained, which a 2-core machine that also runs the load
generator does not reach). Set SCALELAB_SOAK_REQUESTS to ask for an exact count instead.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import ANSWERED, LONG, Server, add_model, run_load, start_server

pytestmark = pytest.mark.reliability

WARMUP = 5_000 if LONG else 1_000
REQUESTS = int(os.environ.get("SCALELAB_SOAK_REQUESTS", "0")) or (0 if LONG else 3_000)
PER_REQUEST_BYTES = 2048
LONG_DURATION = "540s"
CONCURRENCY = "16"
RSS_GROWTH = 0.05
FD_ALLOWANCE = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("repo")
    add_model(root, "flights", {1: 1})
    logdir = tmp_path_factory.mktemp("log")
    srv = start_server(root, logdir / "server.log", "--sample-dir", str(logdir / "samples"),
                       "--sample-max-rows", "500", "--sample-max-files", "3",
                       "--sample-rate", "0.5")
    yield srv
    srv.stop()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settled_fds(pid: int, at_most: int) -> int:
    """The descriptor count once the load tester's connections are gone (bounded poll: the
    server notices closed connections asynchronously)."""
    deadline = time.monotonic() + 15
    n = _fds(pid)
    while n > at_most and time.monotonic() < deadline:
        time.sleep(0.1)
        n = _fds(pid)
    return n


def _load(url: str, *amount: str) -> dict[str, Any]:
    level = run_load(url, "flights", "--concurrency", CONCURRENCY, "--warmup", "0s",
                     "--timeout", "30s", *amount, timeout_s=900)
    kinds = level["errors_by_kind"]
    assert set(kinds) <= ANSWERED, f"unanswered requests: {kinds}"
    assert level["successes"] + sum(kinds.values()) == level["requests"]
    return level


@pytest.mark.timeout(1200)  # the long form runs 9 minutes; the suite default is 300 s
def test_soak_no_memory_growth_no_fd_leak(server: Server) -> None:
    pid = server.proc.pid
    proc = psutil.Process(pid)
    warm = _load(server.url, "--requests", str(WARMUP))
    fds0 = _settled_fds(pid, 10**6)
    rss0 = proc.memory_info().rss
    t0 = time.monotonic()
    amount = ("--requests", str(REQUESTS)) if REQUESTS else ("--duration", LONG_DURATION)
    level = _load(server.url, *amount)
    wall = time.monotonic() - t0
    rss1 = proc.memory_info().rss
    fds1 = _settled_fds(pid, fds0 + FD_ALLOWANCE)

    assert server.proc.poll() is None
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
    growth = (rss1 - rss0) / rss0
    n = level["requests"]
    print(f"\nsoak: warm-up {warm['requests']} requests, then {n} requests in {wall:.0f} s "
          f"({level['throughput_rps']:.0f} req/s, closed loop x{CONCURRENCY}); "
          f"non-200 by status {level['errors_by_status']}; "
          f"RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB ({growth:+.2%}); "
          f"fds {fds0} -> {fds1}; p99 {level['latency']['p99_ms']:.1f} ms")
    assert growth < RSS_GROWTH, f"RSS grew {growth:.2%} over {n} requests"
    # ... and per request: a leak of a few KiB a request is under 5% of a ~370 MiB server over
    # the bounded form's 3,000 requests (12 MiB at 4 KiB), but not under this (measured growth
    # on the development VM: ~0.25 KiB a request, allocator noise included)
    assert (rss1 - rss0) / n < PER_REQUEST_BYTES, \
        f"RSS grew {(rss1 - rss0) / n:.0f} bytes a request over {n} requests"
    assert fds1 <= fds0 + FD_ALLOWANCE, f"file descriptors {fds0} -> {fds1}"
    # a sustainable rate: at most a sliver of requests were turned away
    assert level["failures"] <= max(5, 0.001 * n), level["errors_by_status"]
    if REQUESTS:
        assert n == REQUESTS
    assert "Traceback" not in server.logs()
