"""Cold starts: what scaling to zero costs the requests that arrive while no replica is ready.

A request arriving at second t while no replica is ready waits until the first one is: its
added latency is (first t' >= t with a ready replica) - t, to the simulator's second. Requests
still waiting when the trace ends are counted apart (their wait is at least what was seen).
The percentiles are of requests, not of seconds: each second weighs its arrivals. Pure; the
simulator (`autoscale.simulator.simulate`) passes its per-second arrivals and ready counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True)
class ColdStart:
    """The requests that met zero ready replicas, and how long they waited for one."""

    requests: float
    """Requests that arrived while no replica was ready."""
    episodes: int
    """Stretches of seconds with arrivals and no ready replica (each one start from zero)."""
    zero_seconds: int
    """Seconds with no ready replica (with or without arrivals)."""
    added_p50_ms: float | None
    """Median wait for the first ready replica, over those requests."""
    added_p99_ms: float | None
    added_max_ms: float | None
    unserved: float
    """Of `requests`, those still waiting when the trace ended."""


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The smallest value whose cumulative weight reaches q of the total (the inverse CDF of
    the weighted empirical distribution, as a histogram quantile reads it)."""
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    i = int(np.searchsorted(cum, q * cum[-1] - 1e-9 * cum[-1], side="left"))
    return float(v[order][min(i, len(v) - 1)])


def cold_start(arrivals: Sequence[float], ready: Sequence[int]) -> ColdStart:
    """From per-second arrivals and ready replica counts (same length, second 0 first)."""
    a = np.asarray(arrivals, dtype=float)
    r = np.asarray(ready, dtype=int)
    if a.shape != r.shape:
        raise ValueError(f"arrivals and ready must have one entry per second: {a.shape} vs "
                         f"{r.shape}")
    n = len(a)
    # Next second with a ready replica, from each second on (n: none before the trace ends).
    nxt = np.full(n + 1, n)
    for t in range(n - 1, -1, -1):
        nxt[t] = t if r[t] > 0 else nxt[t + 1]
    cold = [(t, float(a[t])) for t in range(n) if r[t] == 0 and a[t] > 0]
    episodes = sum(1 for i, (t, _) in enumerate(cold)
                   if i == 0 or nxt[cold[i - 1][0]] < t)
    waited = [(float(nxt[t] - t) * 1e3, c) for t, c in cold if nxt[t] < n]
    unserved = sum(c for t, c in cold if nxt[t] >= n)
    total = sum(c for _, c in cold)
    p50: float | None = None
    p99: float | None = None
    top: float | None = None
    if waited:
        ms, w = [x for x, _ in waited], [c for _, c in waited]
        p50, p99, top = weighted_quantile(ms, w, 0.5), weighted_quantile(ms, w, 0.99), max(ms)
    return ColdStart(requests=total, episodes=episodes, zero_seconds=int(np.sum(r == 0)),
                     added_p50_ms=p50, added_p99_ms=p99, added_max_ms=top, unserved=unserved)
