"""Update policies and windows: pure functions, exact numbers."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.system.online.policy import (
    Drift,
    PageHinkley,
    Periodic,
    backoff_wait,
    make_policy,
    page_hinkley,
)
from scalelab.system.online.window import HOUR_US, WindowSpec, closes, sliding_mask, tumbling_index


def test_page_hinkley_by_hand() -> None:
    # x = 0, 0, 1, 1 with delta 0: means 0, 0, 1/3, 1/2; increments 0, 0, 2/3, 1/2;
    # cum 0, 0, 2/3, 7/6; min 0 -> statistic 7/6 at the 4th value.
    assert page_hinkley(np.array([0, 0, 1, 1.0]), delta=0.0, threshold=1.1,
                        min_samples=1) == [3]
    assert page_hinkley(np.array([0, 0, 1, 1.0]), delta=0.0, threshold=1.2,
                        min_samples=1) == []
    # min_samples holds the signal back until enough values were seen
    assert page_hinkley(np.array([0, 0, 1, 1.0]), delta=0.0, threshold=0.5,
                        min_samples=4) == [3]


def test_page_hinkley_restarts_after_a_signal_and_ignores_a_steady_rate() -> None:
    rng = np.random.default_rng(0)
    steady = (rng.random(5000) < 0.3).astype(float)
    assert page_hinkley(steady, threshold=50.0) == []
    jump = np.concatenate([steady, (rng.random(2000) < 0.6).astype(float)])
    hits = page_hinkley(jump, threshold=50.0)
    assert hits and 5000 < hits[0] < 5400  # found soon after the rise, not before it
    ph = PageHinkley(threshold=50.0)
    first = ph.update(jump[:6000])
    assert ph.n == 6000 - 1 - first[-1]  # the state restarted at the last signal


def test_periodic_and_never() -> None:
    p = Periodic(every=7)
    assert [k for k in range(21) if p.decide(k, None)[0]] == [6, 13, 20]
    assert make_policy("never").decide(5, None) == (False, "policy never updates")
    assert make_policy("weekly").name == "weekly"
    assert isinstance(make_policy("every-3"), Periodic)
    with pytest.raises(BadInputError, match="policy 'hourly'"):
        make_policy("hourly")


def test_drift_waits_for_a_signal_and_its_min_gap() -> None:
    d = Drift(detector=PageHinkley(delta=0.0, threshold=1.1, min_samples=1), min_gap=2)
    assert d.decide(0, None)[0] is False
    d.observe(np.array([0, 0, 1, 1.0]))
    assert d.decide(1, 0) == (False, "drift within min_gap")
    assert d.decide(2, 0)[0] is True
    d.updated()
    assert d.decide(3, 2)[0] is False and d.detector.n == 0
    aged = Drift(max_age=5)
    assert aged.decide(4, None)[0] is True and aged.decide(4, 0)[0] is False


def test_backoff_schedule() -> None:
    assert [backoff_wait(r) for r in range(6)] == [1, 2, 4, 7, 7, 7]
    assert [backoff_wait(r, min_gap=2, factor=1.5, cap=10) for r in range(6)] == \
        [2, 3, 5, 7, 10, 10]  # ceil(2 x 1.5**r): 2, 3, 4.5, 6.75, 10.125
    assert [backoff_wait(r, factor=1.0) for r in range(3)] == [1, 1, 1]  # no back-off
    assert backoff_wait(3, min_gap=9, cap=7) == 9  # the gap is a floor, the cap is not
    assert backoff_wait(10_000) == 7  # long runs do not overflow
    with pytest.raises(BadInputError, match="back-off factor must be >= 1"):
        backoff_wait(1, factor=0.5)
    with pytest.raises(BadInputError, match="back-off factor must be >= 1"):
        Drift(backoff=0.5)
    with pytest.raises(BadInputError, match="max_wait >= 1"):
        make_policy("daily", max_wait=0)


def _signal(d: Drift) -> None:
    # 0, 0, 1, 1 at delta 0, threshold 1.1: one signal at the last value (test above)
    d.observe(np.array([0, 0, 1, 1.0]))


def test_drift_backs_off_after_refusals_and_restarts_on_a_promotion() -> None:
    d = Drift(detector=PageHinkley(delta=0.0, threshold=1.1, min_samples=1), max_wait=7)
    attempts, last = [], None
    for k in range(30):
        _signal(d)  # a signal every window: only the back-off holds attempts back
        do, _ = d.decide(k, last)
        if do:
            attempts.append(k)
            last = k
            d.refused()
    # after 1, 2, 3, ... refusals the waits are 2, 4, 7, 7, 7: the exact schedule
    assert attempts == [0, 2, 6, 13, 20, 27]
    assert d.refusals == 6
    assert d.decide(29, 27) == (False, "drift: backing off 7 windows after 6 refused "
                                "attempt(s) in a row")
    d.updated()  # a promotion: the next signal is answered at once again
    assert d.refusals == 0 and d.wait() == 1
    _signal(d)
    assert d.decide(29, 27) == (True, "Page-Hinkley signalled an error-rate rise (1 signal(s))")


def test_drift_rearms_only_on_errors_observed_after_a_refusal() -> None:
    d = Drift(detector=PageHinkley(delta=0.0, threshold=1.1, min_samples=1))
    d.observe(np.array([0, 0, 1]))  # building up, no signal yet
    assert d.pending is None and d.detector.n == 3
    _signal(d)
    assert d.decide(0, None)[0] is True
    d.refused()
    # the evidence before the refusal is gone: neither a pending signal nor the detector's sums
    assert d.pending is None and (d.detector.n, d.detector.cum) == (0, 0.0)
    assert d.decide(5, 0) == (False, "no drift signalled")  # past the wait, yet no new signal
    d.observe(np.array([0, 0, 1]))
    assert d.decide(5, 0)[0] is False
    d.observe(np.array([1.0]))  # the fresh sequence 0, 0, 1, 1 signals
    do, why = d.decide(5, 0)
    assert do and why.endswith("after 1 refused attempt(s) in a row and a 2-window back-off")


def test_windows() -> None:
    t = np.array([0, 5, 10, 15, 20], dtype=np.int64) * HOUR_US
    assert tumbling_index(t, 0, 10 * HOUR_US).tolist() == [0, 0, 1, 1, 2]
    assert tumbling_index(t, 5 * HOUR_US, 10 * HOUR_US).tolist() == [-1, 0, 0, 1, 1]
    assert (closes(0, 25 * HOUR_US, 10 * HOUR_US) // HOUR_US).tolist() == [10, 20, 30]
    ok = np.array([True, True, False, True, True])
    m = sliding_mask(t, ok, 20 * HOUR_US, WindowSpec(kind="time", size=12))
    assert m.tolist() == [False, False, False, True, False]  # [8 h, 20 h), eligible only
    c = sliding_mask(t, ok, 21 * HOUR_US, WindowSpec(kind="count", size=3))
    assert c.tolist() == [False, True, False, True, True]
    with pytest.raises(BadInputError):
        WindowSpec(kind="time", size=0)
