"""Steady state: whether an open-loop step's server kept up with what it was offered.

A capacity step that meets its latency objective has not shown a capacity unless the server was
in a steady state at that rate; a queue that grows passes a short step and collapses in a long
one (issue #44: 7,400 req/s searched, 4,359 served over 20 s). Two tests, both on what the
generator measured (`SteadyTrace`, one per process, added across processes):

- **The served rate is the offered rate, within its interval.** From the window's start to the
  last measured send, the successes completed (warm-up requests' included: a steady queue's
  backlog at the start balances the one at the end) are compared with the measured sends: the
  step kept up unless the served count lies below the exact Poisson interval of the sent count
  at the step's confidence (`poisson_low`). Failures are not served: a server that refuses
  work above a limit serves less than it is offered.
- **No upward latency trend across the step**, the stationarity test. GuideLLM's
  over-saturation detector fits the slope of TTFT and of concurrency against time and calls a
  positive slope with a small margin of error over-saturation, capping its sample size at the
  seconds elapsed because requests of the same second are correlated. Here the same idea is
  done with batch means: successes are binned by their *due* time (`BIN_S`), the bins grouped
  into at most `MAX_BATCHES` batches of at least `MIN_BATCH_S`, and the slope of each batch's
  mean latency against its time fitted by least squares with a Student-t interval on the
  batches (a queue's latencies are correlated; batch means much less so). The step trends
  upward when the slope's lower bound (one-sided at the confidence) is above zero and, at that
  lower bound, the mean latency would reach the objective's threshold within `horizon_s`
  (30 s: the confirmation's default length) — a significant but harmless drift (a cache
  warming the other way round, a 1 ms creep) does not fail a step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

BIN_S = 0.1
"""Width of the due-time bins a process keeps (they add across processes by index)."""
MIN_BATCH_S = 0.25
"""Shortest batch the trend test averages over."""
MAX_BATCHES = 20
"""Most batches: longer steps get longer batches (less correlated means)."""
MIN_BATCHES = 4
"""Fewer batches than this cannot show a trend (the test is not made: 'not judged')."""
HORIZON_S = 30.0
"""A trend matters when, at its lower bound, mean latency reaches the threshold this soon."""


@dataclass(kw_only=True)
class SteadyTrace:
    """What one open-loop run measured for the steady-state tests (plain values: pickles)."""

    bin_s: float = BIN_S
    """Width of each bin of `n` and `lat_s`."""
    n: list[int] = field(default_factory=list)
    """Measured successes due in each bin (from the window's start)."""
    lat_s: list[float] = field(default_factory=list)
    """The sum of their latencies (seconds)."""
    sent: int = 0
    """Measured sends (all due from the window's start to the last measured due time)."""
    served: int = 0
    """Successes, warm-up requests' included, completed in that same span."""
    span_s: float = 0.0
    """From the window's start to the last measured due time."""


def trace_of(t0: float, t1: float, due_ok: np.ndarray, lat_s: np.ndarray, done: np.ndarray,
             sent: int) -> SteadyTrace:
    """One process's trace: `due_ok`/`lat_s` of its measured successes, `done` the completion
    times of all its successes, `sent` its measured sends, the window [t0, t1] on its clock."""
    if sent == 0 or t1 <= t0:
        return SteadyTrace(sent=sent)
    idx = np.floor((np.asarray(due_ok) - t0) / BIN_S).astype(np.int64)
    keep = idx >= 0
    idx, lat = idx[keep], np.asarray(lat_s)[keep]
    size = int(idx.max()) + 1 if idx.size else 0
    d = np.asarray(done)
    return SteadyTrace(n=np.bincount(idx, minlength=size).tolist(),
                       lat_s=np.bincount(idx, weights=lat, minlength=size).tolist(),
                       sent=sent, served=int(np.count_nonzero((d >= t0) & (d <= t1))),
                       span_s=t1 - t0)


def merge_traces(traces: Sequence[SteadyTrace]) -> SteadyTrace:
    """Processes' traces added bin by bin (their windows open at the same instant)."""
    size = max((len(t.n) for t in traces), default=0)
    n = np.zeros(size, dtype=np.int64)
    lat = np.zeros(size)
    for t in traces:
        n[: len(t.n)] += np.asarray(t.n, dtype=np.int64)
        lat[: len(t.lat_s)] += np.asarray(t.lat_s)
    return SteadyTrace(n=n.tolist(), lat_s=lat.tolist(), sent=sum(t.sent for t in traces),
                       served=sum(t.served for t in traces),
                       span_s=max((t.span_s for t in traces), default=0.0))


def poisson_low(k: int, confidence: float) -> float:
    """Lower end of the exact two-sided Poisson interval for the mean of a count k."""
    from scipy.special._ufuncs import gammaincinv

    return 0.0 if k <= 0 else float(gammaincinv(k, (1.0 - confidence) / 2.0))


def _t_quantile(p: float, df: int) -> float:
    from scipy.special._ufuncs import stdtrit

    return float(stdtrit(df, p))


@dataclass(frozen=True, kw_only=True)
class Trend:
    """The least-squares slope of batch-mean latency against time."""

    slope_ms_per_s: float
    low_ms_per_s: float
    """One-sided lower bound at the confidence."""
    batches: int
    mean_ms: float
    """Mean latency over the step."""


def latency_trend(trace: SteadyTrace, confidence: float) -> Trend | None:
    """The trend over batch means, None when the step has under `MIN_BATCHES` batches."""
    n = np.asarray(trace.n, dtype=float)
    lat = np.asarray(trace.lat_s, dtype=float)
    if n.sum() == 0:
        return None
    per = max(1, math.ceil(MIN_BATCH_S / trace.bin_s), math.ceil(len(n) / MAX_BATCHES))
    b = len(n) // per  # the last partial batch is dropped: its latest requests are cut short
    if b < MIN_BATCHES:
        return None
    nb = n[: b * per].reshape(b, per).sum(axis=1)
    lb = lat[: b * per].reshape(b, per).sum(axis=1)
    has = nb > 0
    if has.sum() < MIN_BATCHES:
        return None
    x = (np.arange(b)[has] + 0.5) * per * trace.bin_s
    y = lb[has] / nb[has] * 1e3
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - ym)).sum() / sxx)
    resid = y - (ym + slope * (x - xm))
    df = len(x) - 2
    se = math.sqrt(float((resid ** 2).sum()) / df / sxx)
    low = slope - _t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * se
    return Trend(slope_ms_per_s=slope, low_ms_per_s=low, batches=len(x),
                 mean_ms=float(lat.sum() / n.sum() * 1e3))


@dataclass(frozen=True, kw_only=True)
class Steadiness:
    """The two steady-state tests of one step (see the module doc)."""

    offered_rps: float
    """Measured sends per second over the span."""
    served_rps: float
    """Successes completed per second over the span."""
    served_low_rps: float
    """The lowest served rate the offered one allows (its Poisson interval's lower end)."""
    rate_held: bool
    trend: Trend | None
    """None: too short to judge a trend."""
    trending: bool
    reasons: list[str]
    """Why the step was not steady (empty when it was)."""

    @property
    def steady(self) -> bool:
        return self.rate_held and not self.trending


def judge(trace: SteadyTrace, *, threshold_s: float | None, confidence: float,
          horizon_s: float = HORIZON_S) -> Steadiness:
    """Both tests on one step's trace (pure)."""
    span = max(trace.span_s, 1e-9)
    low = poisson_low(trace.sent, confidence)
    held = trace.served >= low
    reasons: list[str] = []
    if not held:
        reasons.append(
            f"served {trace.served / span:.4g} req/s of the {trace.sent / span:.4g} offered: "
            f"below the offered rate's {confidence:.0%} interval (≥ {low / span:.4g}); the "
            "server did not keep up")
    trend = latency_trend(trace, confidence)
    trending = False
    if trend is not None and trend.low_ms_per_s > 0:
        headroom = (threshold_s * 1e3 - trend.mean_ms) if threshold_s is not None else 0.0
        trending = trend.low_ms_per_s * horizon_s >= headroom
        if trending:
            reasons.append(
                f"latency rose {trend.slope_ms_per_s:.3g} ms/s across the step (at least "
                f"{trend.low_ms_per_s:.3g} at {confidence:.0%}, {trend.batches} batches): at "
                f"that rise the mean ({trend.mean_ms:.3g} ms) reaches the threshold within "
                f"{horizon_s:g} s; a queue is building")
    return Steadiness(offered_rps=trace.sent / span, served_rps=trace.served / span,
                      served_low_rps=low / span, rate_held=held, trend=trend,
                      trending=trending, reasons=reasons)
