"""The mutations `run.py` applies: one broken line each, and the tests that must catch it.

One per row of the README's Guarantees table at least, on the modules the promise rests on, and
the three breaks of issue #47 (p90 read as p95, latency timed from the send, the decode step's
padding mask dropped). `line` is the source line as it is (matched stripped of surrounding
space, and it must occur exactly once in its file); `mutated` replaces it at its indentation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    """Short name (the README row or the break it stands for)."""
    file: str
    """Path from the repository root."""
    line: str
    """The line as it is."""
    mutated: str
    """The line broken."""
    tests: tuple[str, ...]
    """Test files or ids (from the repository root) that must fail."""


L = "tests/lab/load/"
MUTATIONS: list[Mutation] = [
    # ---- issue #47's three breaks ----
    Mutation("p90 read as p95", "src/scalelab/lab/load/histogram.py",
             "return Percentiles(count=self.count, p50_ms=ms[0], p90_ms=ms[1], p95_ms=ms[2],",
             "return Percentiles(count=self.count, p50_ms=ms[0], p90_ms=ms[1], p95_ms=ms[1],",
             (L + "test_histogram.py",)),
    Mutation("HTTP open loop timed from the send", "src/scalelab/lab/load/http/generator.py",
             "conn.send(self._next_request(measured), (due, measured))",
             "conn.send(self._next_request(measured), (now(), measured))",
             (L + "test_latency_truth.py::test_http_open_loop_latency_includes_the_wait_for_a"
              "_connection",)),
    Mutation("SSE open loop timed from the send", "src/scalelab/lab/load/llm/stream.py",
             "conn, waited = await self._pool.acquire()",
             "conn, waited = await self._pool.acquire(); start = now()",
             (L + "test_latency_truth.py::test_sse_ttft_and_e2e_include_the_wait_for_a_stream",)),
]
