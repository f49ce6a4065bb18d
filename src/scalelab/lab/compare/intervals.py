"""Intervals on B/A and the p-values they imply, for the three kinds of evidence.

* A latency quantile of two sets of latencies: each side's two-sided interval by the verdict's
  order-statistic rule (`core.decide.order_ranks`), each at 1 − α/2 so both hold together
  with ≥ 1 − α (Bonferroni over the two sides), and the ratio's interval
  [B_low / A_high, B_high / A_low]. Conservative: the ratio's true coverage is higher.
* A value measured once per repeat (rates, and quantiles of records without histograms): Welch's
  t interval on the difference of the mean logs, exponentiated (a ratio of geometric means).
* A failure rate: Fisher's exact test of k_A/n_A against k_B/n_B (no interval on a ratio of
  rates that may be 0).

A p-value comes from inverting an interval: the smallest α at which the 1 − α interval lies
outside [1 − margin, 1 + margin] ("different" by more than the margin), or at which the
1 − 2α interval lies inside it ("equivalent", the two one-sided tests). Holm's step-down then
corrects for the number of comparisons made.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scalelab.lab.core.decide import order_ranks

Interval = tuple[float, float]
"""(lower, upper) of B/A; 0 and inf stand for a side without a bound."""


@dataclass(frozen=True, kw_only=True)
class Latencies:
    """One side's latencies of one metric: histogram buckets, or only recorded quantiles."""

    values_ms: np.ndarray
    """Bucket values ascending (each latency at its bucket's value); empty for recorded-only."""
    counts: np.ndarray
    """Latencies in each bucket."""
    n: int
    """Latencies in all."""
    recorded: dict[float, float] | None = None
    """Quantile -> ms when no histogram was kept (the record's p50…max)."""
    slices: tuple[str, ...] = ()
    """The latencies in consecutive slices (histogram blobs, `load.slices`), repeats one
    after another; () when a record kept none."""

    def at_rank(self, k: int) -> float:
        """The k-th smallest latency (1-based) in ms."""
        cum = np.cumsum(self.counts)
        return float(self.values_ms[int(np.searchsorted(cum, k))])

    def quantile(self, q: float) -> float:
        """The q-quantile as the histogram reports it: the value of rank ⌈q·n⌉."""
        if self.recorded is not None:
            return self.recorded[q]
        return self.at_rank(max(1, math.ceil(q * self.n - 1e-9)))

    def bounds(self, q: float, level: float) -> Interval:
        """Two-sided interval on the q-quantile at `level`: one-sided ranks at (1 + level)/2."""
        side = 1.0 - (1.0 - level) / 2.0
        low_rank, up_rank = order_ranks(self.n, q, side)
        if self.recorded is not None:
            from scalelab.lab.core.decide import quantile_bounds

            lo, hi = quantile_bounds(self.recorded, self.n, q, side)
            return (0.0 if lo is None else lo), (math.inf if hi is None else hi)
        lo = 0.0 if low_rank is None else self.at_rank(low_rank)
        hi = math.inf if up_rank is None else self.at_rank(up_rank)
        return lo, hi


def quantile_ratio(a: Latencies, b: Latencies, q: float, alpha: float) -> Interval:
    """Interval on B's q-quantile over A's with joint confidence ≥ 1 − α."""
    a_lo, a_hi = a.bounds(q, 1.0 - alpha / 2.0)
    b_lo, b_hi = b.bounds(q, 1.0 - alpha / 2.0)
    lo = b_lo / a_hi if a_hi > 0 else 0.0
    hi = b_hi / a_lo if a_lo > 0 else math.inf
    return lo, hi


@dataclass(frozen=True, kw_only=True)
class Repeats:
    """Welch's t on log values of each repeat: what a ratio of rates over repeats rests on."""

    a: tuple[float, ...]
    b: tuple[float, ...]

    @property
    def usable(self) -> bool:
        """At least 2 positive values a side, and some spread (else no interval exists)."""
        ok = (len(self.a) >= 2 and len(self.b) >= 2 and min(self.a) > 0 and min(self.b) > 0)
        return ok and bool(np.var(np.log(self.a)) > 0 or np.var(np.log(self.b)) > 0)

    def _welch(self) -> tuple[float, float, float]:
        la, lb = np.log(self.a), np.log(self.b)
        va, vb = np.var(la, ddof=1) / len(la), np.var(lb, ddof=1) / len(lb)
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / ((va**2 / (len(la) - 1) if va else 0.0)
                               + (vb**2 / (len(lb) - 1) if vb else 0.0))
        return float(lb.mean() - la.mean()), se, float(df)

    def point(self) -> float:
        return math.exp(self._welch()[0])

    def ratio(self, alpha: float) -> Interval:
        from scipy.special import stdtrit  # ~0.5 s to import: only compare pays it

        d, se, df = self._welch()
        t = float(stdtrit(df, 1.0 - alpha / 2.0))
        # Tiny α (the p-value search) gives t in the thousands: 0 and inf, not an overflow.
        lo, hi = d - t * se, d + t * se
        return (math.exp(lo) if lo > -700 else 0.0), (math.exp(hi) if hi < 700 else math.inf)


def fisher_p(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher exact p-value of k_A of n_A failures against k_B of n_B."""
    from scipy.stats import fisher_exact  # ~1.4 s: paid only when a side failed

    res = fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]])
    return float(res.pvalue)


def _smallest_alpha(holds: Callable[[float], bool], top: float = 1.0 - 1e-9) -> float:
    """The smallest α in (0, top] at which `holds(α)` (monotone: once true, true for larger
    α); 1.0 when it never holds."""
    if not holds(top):
        return 1.0
    lo, hi = 1e-12, top
    if holds(lo):
        return lo
    for _ in range(60):  # bisection on log α: 1e-12 … 1 to a relative 1e-4
        mid = math.sqrt(lo * hi)
        if holds(mid):
            hi = mid
        else:
            lo = mid
        if hi / lo < 1.0001:
            break
    return hi


def p_different(interval: Callable[[float], Interval], margin: float = 0.0) -> float:
    """The smallest α whose 1 − α interval on B/A lies wholly outside [1 − margin, 1 + margin]
    (outside 1 alone with no margin): a difference larger than the margin."""
    def outside(a: float) -> bool:
        lo, hi = interval(a)
        return lo > 1.0 + margin or hi < 1.0 - margin

    return _smallest_alpha(outside)


def p_equivalent(interval: Callable[[float], Interval], margin: float) -> float:
    """The smallest α whose 1 − 2α interval lies inside [1 − margin, 1 + margin] (TOST)."""
    def inside(a: float) -> bool:
        lo, hi = interval(2.0 * a)
        return lo >= 1.0 - margin and hi <= 1.0 + margin

    return _smallest_alpha(inside, top=0.5 - 1e-9)


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down: which hypotheses are rejected with family-wise error ≤ α."""
    m = len(p_values)
    out = [False] * m
    for i, j in enumerate(sorted(range(m), key=lambda k: p_values[k])):
        if p_values[j] > alpha / (m - i):
            break
        out[j] = True
    return out
