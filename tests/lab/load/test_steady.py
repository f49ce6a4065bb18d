"""The steady-state tests of a capacity step (pure: hand-made traces, exact numbers)."""

import numpy as np
import pytest

from scalelab.lab.load.steady import (
    SteadyTrace,
    judge,
    latency_trend,
    merge_traces,
    poisson_low,
    trace_of,
)


def _trace(lat_ms: list[float], *, per_bin: int = 10, sent: int | None = None,
           served: int | None = None) -> SteadyTrace:
    n = [per_bin] * len(lat_ms)
    total = per_bin * len(lat_ms)
    return SteadyTrace(n=n, lat_s=[x / 1e3 * per_bin for x in lat_ms],
                       sent=total if sent is None else sent,
                       served=total if served is None else served, span_s=len(lat_ms) * 0.1)


def test_a_flat_step_is_steady() -> None:
    s = judge(_trace([10.0, 12.0] * 15), threshold_s=0.2, confidence=0.95)
    assert s.steady and s.rate_held and not s.trending and s.reasons == []
    assert s.trend is not None and s.trend.batches == 10  # 3 s in 0.3 s batches (≥ 0.25 s)
    assert s.trend.mean_ms == pytest.approx(11.0)
    assert (s.offered_rps, s.served_rps) == pytest.approx((100.0, 100.0))


def test_a_growing_queue_trends_upward() -> None:
    # Latency rising 100 ms per second, exactly: the slope's interval is the point.
    s = judge(_trace([10.0 + 10.0 * i for i in range(30)]), threshold_s=0.2, confidence=0.95)
    assert s.trend is not None
    assert s.trend.slope_ms_per_s == pytest.approx(100.0)
    assert s.trend.low_ms_per_s == pytest.approx(100.0)
    assert s.trending and not s.steady
    assert s.reasons[0].startswith("latency rose 100 ms/s across the step (at least 100 at 95%, "
                                   "10 batches)")


def test_a_slight_drift_far_from_the_threshold_is_not_a_trend() -> None:
    # +0.1 ms/s from a 10 ms mean: 3 ms in 30 s, far from the 200 ms threshold.
    s = judge(_trace([10.0 + 0.01 * i for i in range(30)]), threshold_s=0.2, confidence=0.95)
    assert s.trend is not None and s.trend.low_ms_per_s > 0 and not s.trending


def test_a_short_step_is_not_judged_for_trend() -> None:
    assert latency_trend(_trace([10.0, 50.0, 90.0]), 0.95) is None  # 0.3 s: one batch


def test_served_below_the_offered_rates_interval_is_not_steady() -> None:
    # The exact interval's lower end: chi2.ppf(0.025, 2000) / 2.
    assert poisson_low(1000, 0.95) == pytest.approx(938.973, abs=1e-3)
    held = judge(_trace([10.0] * 30, sent=1000, served=939), threshold_s=0.2, confidence=0.95)
    short = judge(_trace([10.0] * 30, sent=1000, served=938), threshold_s=0.2, confidence=0.95)
    assert held.rate_held and not short.rate_held and not short.steady
    assert short.reasons[0].startswith("served 312.7 req/s of the 333.3 offered")


def test_a_trace_is_binned_by_due_time_and_adds_across_processes() -> None:
    due = np.array([0.05, 0.15, 0.16, 0.31])
    t = trace_of(0.0, 0.35, due, np.array([0.01, 0.02, 0.04, 0.1]),
                 np.array([-0.01, 0.06, 0.2, 0.4]), sent=4)
    assert (t.n, t.served, t.span_s) == ([1, 2, 0, 1], 2, 0.35)
    assert t.lat_s == pytest.approx([0.01, 0.06, 0.0, 0.1])
    m = merge_traces([t, SteadyTrace(n=[1], lat_s=[0.5], sent=1, served=1, span_s=0.2)])
    assert (m.n, m.sent, m.served, m.span_s) == ([2, 2, 0, 1], 5, 3, 0.35)
    assert m.lat_s == pytest.approx([0.51, 0.06, 0.0, 0.1])
