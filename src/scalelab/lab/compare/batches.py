"""Batch means: how far a quantile moves within one run, from the run's consecutive slices.

The order-statistic interval (intervals.quantile_ratio) treats a run's n latencies as n
independent draws. On a real machine they are not: a neighbour's burst, a GC pause or a
warming cache slows many consecutive requests alike, and two 2 s runs of one server then
differed by more than that interval allowed on 6 of 20 pairs (docs/compare.md). The classic
remedy for correlated samples is batch means: cut the run into G consecutive batches and let
the spread of a mean over the batches give the run's standard error, s/√G, with G − 1 degrees
of freedom.

The mean batched here is the share of a batch's latencies at or below the whole run's
q-quantile (q itself for the whole run, by definition): its spread says how far the run's
quantile could move *in rank*, and the interval reads the run's own latencies at q ∓ t·s/√G
(`share_bounds`). Working in ranks rather than with each batch's own quantile keeps a small
batch of a two-mode distribution (a quantile near the gap) from swinging between the modes.
Independent latencies give s/√G ≈ √(q(1 − q)/n), the order statistic's own width; the
comparison takes the wider of the two at each confidence, so the batches only ever widen it.

Each side's slices (`load.slices`, concatenated over its repeats: with 2 repeats the drift
between them shows in the batches, but with the batches' df rather than the runs' 1, so
comparison.py also takes the pooled t over the 2 runs, the wider) are merged into G groups
of consecutive slices, G as large as `MIN_TAIL` latencies on the rarer side of the quantile
per group allow, at most the slices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scalelab.lab.load.histogram import LatencyHistogram

MIN_TAIL = 5
"""Latencies expected above the quantile in each batch (p50: 10 a batch, p95: 100, p99: 500):
fewer and a batch's quantile is its maximum, not an estimate of the quantile."""
MIN_GROUPS = 2
"""Fewest batches a side for a spread (1 degree of freedom: an honest but very wide t)."""


def per_group(q: float) -> int:
    """Latencies a batch needs for the q-quantile."""
    return math.ceil(MIN_TAIL / (1.0 - q) - 1e-9)


def least_latencies(q: float) -> int:
    """Latencies a side needs for any batch estimate of the q-quantile."""
    return MIN_GROUPS * per_group(q)


def _groups(slices: Sequence[str], q: float) -> list[LatencyHistogram]:
    hists = [LatencyHistogram.decode(b) for b in slices]
    n = sum(h.count for h in hists)
    g = min(len(hists), n // per_group(q))
    if g < MIN_GROUPS:
        return []
    out = []
    for idx in np.array_split(np.arange(len(hists)), g):
        h = LatencyHistogram()
        for i in idx.tolist():
            h.merge(hists[int(i)])
        if h.count == 0:
            return []
        out.append(h)
    return out


@dataclass(frozen=True)
class ShareSpread:
    """The batches' spread of the share of latencies at or below the run's quantile."""

    se: float
    """Standard error of the run's share: the batch shares' standard deviation over √G."""
    batches: int


def share_spread(slices: Sequence[str], q: float, quantile_ms: float) -> ShareSpread | None:
    """The spread of a run's q-quantile in rank, from its slices; None with too few batches
    (or latencies) to see one."""
    groups = _groups(slices, q)
    if not groups:
        return None
    shares = [h.count_at_or_below(quantile_ms / 1e3) / h.count for h in groups]
    return ShareSpread(se=float(np.std(shares, ddof=1)) / math.sqrt(len(shares)),
                       batches=len(shares))


def share_bounds(values_ms: np.ndarray, counts: np.ndarray, q: float, level: float,
                 s: ShareSpread) -> tuple[float, float]:
    """Two-sided interval at `level` on the q-quantile of these latencies (histogram buckets)
    read at ranks (q ∓ t·se)·n, t of Student with G − 1 degrees of freedom; 0 and inf where
    the rank falls off the run."""
    from scipy.special import stdtrit

    t = float(stdtrit(s.batches - 1, 1.0 - (1.0 - level) / 2.0))
    n = int(counts.sum())
    cum = np.cumsum(counts)

    def at(p: float) -> float:
        rank = max(1, math.ceil(p * n - 1e-9))
        return float(values_ms[int(np.searchsorted(cum, rank))])

    lo_p, hi_p = q - t * s.se, q + t * s.se
    return (at(lo_p) if lo_p > 0 else 0.0), (at(hi_p) if hi_p <= 1.0 else math.inf)
