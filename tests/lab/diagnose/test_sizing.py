"""Sequential sizing on known-truth loopback endpoints: a level runs chunks of real load (the
`scalelab load run` generator, in-process) until its objectives are decided, and no longer;
while undecided it continues until its share is spent. Chunks merge exactly."""

import contextlib
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record, read_records
from scalelab.lab.diagnose.sizing import NEED_MARGIN, LevelClock, pending, size_level
from scalelab.lab.load.http.result import merge_records as merge_chunks

RATE = 200.0
"""Requests/s of every chunk: constant arrivals, so 0.5 s is 100 requests."""


class _EveryNth(BaseHTTPRequestHandler):
    """Answers at once; request k (counted from 1) fails with 500 when `every` divides k."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    lock = threading.Lock()
    count = 0
    every = 0

    def do_GET(self) -> None:
        with self.lock:
            type(self).count += 1
            fail = self.every > 0 and self.count % self.every == 0
        body = b"no" if fail else b"ok"
        self.send_response(500 if fail else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def _serve(every: int) -> Iterator[str]:
    handler = type("Handler", (_EveryNth,), {"count": 0, "every": every,
                                             "lock": threading.Lock()})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/x"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def healthy() -> Iterator[str]:
    yield from _serve(every=0)


@pytest.fixture
def one_in_ten() -> Iterator[str]:
    yield from _serve(every=10)


class Chunks:
    """Runs each chunk as a real load step and keeps what it was asked and measured."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.asked: list[float] = []
        self.records: list[Record] = []

    def __call__(self, seconds: float, index: int) -> Record | None:
        self.asked.append(seconds)
        path = self.tmp / f"chunk-{index}.jsonl"
        with contextlib.redirect_stdout(io.StringIO()):
            rc = run(["load", "run", self.url, "--rate", f"{RATE:g}", "--arrival", "constant",
                      "--duration", f"{seconds:.3g}s", "--warmup", "0s", "--no-cold-start",
                      "--records", str(path), "--json"])
        if rc != 0:
            return None
        rec = read_records(path)[0]
        self.records.append(rec)
        return rec


AVAIL_99 = Objective(metric="availability", min=0.99, label="availability ≥ 99%")
P95 = Objective(metric="p95_ms", max=500.0, label="p95 ≤ 500 ms")


def test_a_level_stops_at_the_first_chunk_that_decides(healthy: str, tmp_path: Path) -> None:
    """p95 ≤ 500 ms on an endpoint answering at once: 100 requests bound it (59 do)."""
    chunks = Chunks(healthy, tmp_path)
    got = size_level(chunks, [P95], first_s=0.5, share_s=30.0)
    assert got is not None
    sizing = got.extras["sizing"]
    assert (sizing["chunks"], sizing["stopped"], sizing["undecided"]) == (1, "decided", [])
    assert chunks.asked == [0.5]


def test_a_level_continues_while_undecided_then_stops_when_decided(
    healthy: str, tmp_path: Path
) -> None:
    """Availability ≥ 99% without a failure needs 299 requests at 95%: the first chunk's 100
    are short, so the second is sized to the 199 still needed at the rate the first measured
    (with NEED_MARGIN), and the level stops at the first chunk that decides although most of
    its 30 s share is left."""
    chunks = Chunks(healthy, tmp_path)
    got = size_level(chunks, [AVAIL_99], first_s=0.5, share_s=30.0)
    assert got is not None
    # the second chunk: the samples still needed at the first's rate (a generator starved by
    # a busy host sends fewer, so a third may follow: the rule below decides, not the count)
    n1 = chunks.records[0].extras["samples"]
    assert chunks.asked[1] == pytest.approx(max(0.5, (299 - n1) / (n1 / 0.5) * NEED_MARGIN))
    # each prefix but the whole was undecided by the verdict's own rule; the whole is decided
    for k in range(1, len(chunks.records)):
        assert pending(merge_chunks(chunks.records[:k]), [AVAIL_99]), k
    assert pending(got, [AVAIL_99]) == []
    n = sum(r.extras["samples"] for r in chunks.records)
    assert got.extras["samples"] == n and got.extras["sizing"]["samples"] == n
    assert got.extras["sizing"]["stopped"] == "decided" and n >= 299
    assert got.latency is not None and got.failures == 0


def test_an_undecided_level_stops_when_its_share_is_spent(healthy: str,
                                                          tmp_path: Path) -> None:
    """99.9% needs 2,995 requests without a failure: 15 s at 200/s, past a 2.5 s share."""
    avail = Objective(metric="availability", min=0.999, label="availability ≥ 99.9%")
    chunks = Chunks(healthy, tmp_path)
    got = size_level(chunks, [avail], first_s=0.5, share_s=2.5)
    assert got is not None
    sizing = got.extras["sizing"]
    assert sizing["stopped"] == "time share spent" and sizing["chunks"] >= 2
    assert sum(chunks.asked) <= 2.5  # no chunk was asked past the share
    (line,) = sizing["undecided"]
    assert line.startswith(f"availability ≥ 99.9%: {sizing['samples']:,} requests; 99.9% "
                           "needs ≥ 2,995 without a failure")


def test_a_known_failure_rate_is_missed_at_once(one_in_ten: str, tmp_path: Path) -> None:
    """Every 10th request fails: availability 90% is decided missed on the first chunk, with
    exactly the failures the endpoint returned."""
    chunks = Chunks(one_in_ten, tmp_path)
    got = size_level(chunks, [AVAIL_99], first_s=0.5, share_s=30.0)
    assert got is not None and got.extras["sizing"]["chunks"] == 1
    n = got.extras["samples"]
    assert got.failures == n // 10 and got.extras["sizing"]["stopped"] == "decided"


def test_the_level_clock_gives_unused_time_to_later_levels() -> None:
    now = [0.0]
    clock = LevelClock(share_s=100.0, levels=4, cap_s=2.0, reserve_s=20.0, clock=lambda: now[0])
    assert clock.next_share() == 20.0  # (100 - 20) / 4
    now[0] = 5.0  # the first level was decided after 5 s: 15 s go to the next three
    assert clock.next_share() == 25.0  # (100 - 5 - 20) / 3
    assert LevelClock(share_s=None, levels=4, cap_s=2.0).next_share() == 2.0
