"""Latency histogram: HdrHistogram in microseconds, mergeable across generator processes.

Percentiles come from the histogram, never from a mean; each generator process keeps its own and
ships it as HdrHistogram's compressed base64 blob (a few KiB), which the parent decodes and adds.
Values are recorded with 3 significant digits (0.1% relative error) from 1 µs to 1 hour.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from scalelab.lab.core.records import Latency

_LOWEST_US = 1
_HIGHEST_US = 3_600_000_000
_DIGITS = 3
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)


@dataclass(frozen=True, kw_only=True)
class Percentiles:
    """Latency percentiles in milliseconds (None when nothing was recorded)."""

    count: int
    """Values recorded."""
    p50_ms: float | None
    """Median."""
    p90_ms: float | None
    """90th percentile."""
    p95_ms: float | None
    """95th percentile."""
    p99_ms: float | None
    """99th percentile."""
    p999_ms: float | None
    """99.9th percentile."""
    max_ms: float | None
    """Largest value recorded."""
    mean_ms: float | None
    """Mean, for reference only: queues hide in it."""

    def latency(self) -> Latency:
        """As the records schema's Latency."""
        return Latency(p50_ms=self.p50_ms, p90_ms=self.p90_ms, p95_ms=self.p95_ms,
                       p99_ms=self.p99_ms, p999_ms=self.p999_ms, max_ms=self.max_ms)


class LatencyHistogram:
    """Record latencies in seconds; read percentiles in milliseconds; merge by blob."""

    def __init__(self) -> None:
        self._h = HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)

    def record_us(self, values_us: np.ndarray) -> None:
        """Record many latencies (integer microseconds) at once: one histogram update per
        distinct value, so the generator's hot path only appends to an array."""
        if len(values_us) == 0:
            return
        vals, counts = np.unique(np.clip(values_us, _LOWEST_US, _HIGHEST_US), return_counts=True)
        rec = self._h.record_value
        for v, c in zip(vals.tolist(), counts.tolist(), strict=True):
            rec(v, c)

    def record(self, seconds: float) -> None:
        us = int(seconds * 1e6)
        # Clamp instead of dropping: a value outside the range still counts as a request.
        self._h.record_value(min(max(us, _LOWEST_US), _HIGHEST_US))

    @property
    def count(self) -> int:
        return int(self._h.get_total_count())

    def quantile_ms(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1) in ms, or None when empty."""
        if self.count == 0:
            return None
        return float(self._h.get_value_at_percentile(100.0 * q)) / 1e3

    def max_ms(self) -> float | None:
        return None if self.count == 0 else float(self._h.get_max_value()) / 1e3

    def _counts(self) -> np.ndarray:
        """The bucket counts as an array (a decoded histogram's may be shorter than its range).
        Why: hdrh's iterators walk all ~23,500 buckets in Python, ~50 ms a call."""
        n = min(self._h.counts_len, self._h.encoder.payload.counts_len)
        return np.ctypeslib.as_array(self._h.counts)[:n]

    def buckets_ms(self) -> tuple[np.ndarray, np.ndarray]:
        """(values in ms, counts) of the non-empty buckets, ascending; each bucket at its highest
        equivalent value, as the percentiles report it: the order statistic of any rank."""
        counts = self._counts()
        idx = np.flatnonzero(counts)
        h = self._h
        values = [h.get_highest_equivalent_value(h.get_value_from_index(i)) for i in idx.tolist()]
        return np.asarray(values, dtype=float) / 1e3, counts[idx].astype(np.int64)

    def count_at_or_below(self, seconds: float) -> int:
        """How many recorded values are <= `seconds` (to histogram resolution: the bucket
        holding `seconds` counts whole, as HdrHistogram's own iteration does)."""
        limit = min(max(int(seconds * 1e6), 0), _HIGHEST_US)
        counts = self._counts()
        return int(counts[:self._h.get_counts_array_index(limit) + 1].sum())

    def mean_ms(self) -> float | None:
        """HdrHistogram's mean (each bucket at its median equivalent value), in ms."""
        if self.count == 0:
            return None
        counts = self._counts()
        h = self._h
        total = 0
        for i in np.flatnonzero(counts).tolist():
            v = h.get_value_from_index(i)
            lo = h.get_lowest_equivalent_value(v)
            total += int(counts[i]) * (lo + ((h.get_highest_equivalent_value(v) - lo + 1) >> 1))
        return total / self.count / 1e3

    def percentiles(self) -> Percentiles:
        if self.count == 0:
            return Percentiles(count=0, p50_ms=None, p90_ms=None, p95_ms=None, p99_ms=None,
                               p999_ms=None, max_ms=None, mean_ms=None)
        vals = self._h.get_percentile_to_value_dict(list(PERCENTILES))
        ms = [float(vals[p]) / 1e3 for p in PERCENTILES]
        return Percentiles(count=self.count, p50_ms=ms[0], p90_ms=ms[1], p95_ms=ms[2],
                           p99_ms=ms[3], p999_ms=ms[4], max_ms=self.max_ms(),
                           mean_ms=self.mean_ms())

    def encode(self) -> str:
        """Compressed base64 blob (HdrHistogram V2 format), to ship across processes or files."""
        blob = self._h.encode()
        return blob.decode("ascii") if isinstance(blob, bytes) else str(blob)

    @classmethod
    def decode(cls, blob: str) -> LatencyHistogram:
        h = cls()
        h.add_blob(blob)
        return h

    def add_blob(self, blob: str) -> None:
        self._h.decode_and_add(blob)

    def merge(self, other: LatencyHistogram) -> None:
        self._h.add(other._h)
