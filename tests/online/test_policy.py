"""Update policies and windows: pure functions, exact numbers."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab.core.errors import BadInputError
from scalelab.online.policy import Drift, PageHinkley, Periodic, make_policy, page_hinkley
from scalelab.online.window import HOUR_US, WindowSpec, closes, sliding_mask, tumbling_index


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
