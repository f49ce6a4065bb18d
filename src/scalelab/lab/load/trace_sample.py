"""Which of the load generator's requests carry a `traceparent` (`scalelab load --trace-sample`).

A sampled request gets a fresh trace id with the sampled flag set, so a server with tracing on
(`--trace-out`, even at `--trace-sample 0`) follows exactly these requests. Which ones is
decided by a seeded generator, per measured send: the same seed marks the same sends. The
generator's requests are HTTP bytes encoded once; a marked one is a copy with the header
added (tens of microseconds, paid only by the marked share).
"""

from __future__ import annotations

import random

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.traceparent import fresh, with_header

KEEP_IDS = 1000
"""Trace ids listed in a run's result at most (the count is exact past it)."""


class TraceSampler:
    """Marks a share of requests with a new sampled trace; remembers their trace ids."""

    def __init__(self, share: float, *, seed: int = 0, keep: int = KEEP_IDS) -> None:
        if not 0.0 < share <= 1.0:
            raise BadUsageError(f"--trace-sample {share} must lie in (0, 1]")
        self.share = share
        self.keep = keep
        self._rng = random.Random(seed)
        self.count = 0
        self.trace_ids: list[str] = []

    def mark(self, request: bytes) -> bytes:
        """`request`, or a copy carrying a fresh sampled traceparent."""
        if self.share < 1.0 and self._rng.random() >= self.share:
            return request
        tp = fresh()
        self.count += 1
        if len(self.trace_ids) < self.keep:
            self.trace_ids.append(tp.trace_id)
        return with_header(request, tp.header())
