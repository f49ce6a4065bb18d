"""A run's latencies in consecutive slices, one HdrHistogram each.

So a reader can see how much a quantile moves within one run (`lab/compare` uses the slices
as batch means).

Latencies on one machine are not independent: a neighbour's burst, a GC pause or a cache that
warms slows many consecutive requests alike, so an interval that treats n latencies as n
independent draws is too narrow, and two runs of the same server then look different. The
spread of a quantile across slices of the same run shows that correlated noise; it costs
`SLICES` small histograms per metric in the record (~0.1-1.5 KB each).

Each process cuts its latencies, in completion order, into `SLICES` runs of equal count; the
parent adds the processes' slices index by index (they run the same schedule, so slice i of
each covers about the same stretch of time).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scalelab.lab.load.histogram import LatencyHistogram

SLICES = 10
"""Slices per run and metric."""

def slice_blobs(values_us: np.ndarray, k: int = SLICES) -> list[str]:
    """`values_us` (in completion order) cut into k runs of equal count (the first ones one
    longer where k does not divide), one histogram blob each; [] for fewer than k values."""
    v = np.asarray(values_us, dtype=np.int64)
    if len(v) < k:
        return []
    out = []
    for part in np.array_split(v, k):
        h = LatencyHistogram()
        h.record_us(part)
        out.append(h.encode())
    return out


def merge_slices(per_process: Sequence[Sequence[str]]) -> list[str]:
    """The processes' slices added index by index; a process with none adds nothing. [] when
    no process has slices, or when they disagree on how many."""
    have = [s for s in per_process if s]
    if not have or len({len(s) for s in have}) != 1:
        return []
    out = []
    for i in range(len(have[0])):
        h = LatencyHistogram()
        for s in have:
            h.add_blob(s[i])
        out.append(h.encode())
    return out


def chained(per_chunk: Sequence[dict[str, list[str]]]) -> dict[str, list[str]]:
    """The slices (`Record.slices`) of consecutive chunks of one level (`load run`'s chunks)
    one after another, per metric; a metric is kept only where every chunk has slices of it."""
    if not per_chunk or not all(per_chunk):
        return {}
    names = set.intersection(*(set(d) for d in per_chunk))
    return {n: [b for d in per_chunk for b in d[n]] for n in sorted(names)}
