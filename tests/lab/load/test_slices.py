"""A run's latencies in consecutive slices: equal counts in completion order, added across
processes index by index, chained across chunks."""

from __future__ import annotations

import numpy as np

from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.slices import chained, merge_slices, slice_blobs


def _counts_and_max(blobs: list[str]) -> list[tuple[int, float]]:
    hs = [LatencyHistogram.decode(b) for b in blobs]
    return [(h.count, round(h.max_ms(), 3)) for h in hs]


def test_slices_are_consecutive_runs_of_equal_count() -> None:
    us = np.arange(1000, 1023, dtype=np.int64)  # 23 latencies: 1.000 … 1.022 ms in order
    got = _counts_and_max(slice_blobs(us, k=5))
    assert got == [(5, 1.004), (5, 1.009), (5, 1.014), (4, 1.018), (4, 1.022)]
    assert slice_blobs(us[:4], k=5) == []


def test_processes_add_index_by_index_and_chunks_chain() -> None:
    one = slice_blobs(np.full(20, 2000, dtype=np.int64), k=2)
    two = slice_blobs(np.full(10, 3000, dtype=np.int64), k=2)
    merged = merge_slices([one, [], two])
    # 3 ms reads as its bucket's top, 3.001 ms (3 significant digits).
    assert _counts_and_max(merged) == [(15, 3.001), (15, 3.001)]
    assert merge_slices([one, slice_blobs(np.full(9, 1, dtype=np.int64), k=3)]) == []
    assert chained([{"latency": one}, {"latency": two}]) == {"latency": one + two}
    assert chained([{"latency": one}, {}]) == {}
