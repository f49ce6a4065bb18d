"""The statistics of `compare`: order-statistic ratio intervals, Welch over repeats, Holm."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalelab.lab.compare.intervals import (
    Latencies,
    Repeats,
    holm,
    p_different,
    p_equivalent,
    quantile_ratio,
)
from scalelab.lab.core.decide import order_ranks


def _lat(values: list[float]) -> Latencies:
    v, c = np.unique(np.asarray(values, dtype=float), return_counts=True)
    return Latencies(values_ms=v, counts=c, n=len(values))


def test_holm_steps_down_and_stops_at_the_first_kept_hypothesis() -> None:
    # Sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2 stops (0.04 is kept too).
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.02, 0.04], 0.05) == [True, True]  # 0.02 <= 0.025, then 0.04 <= 0.05
    assert holm([], 0.05) == []


def test_order_statistics_at_rank_and_the_verdicts_ranks() -> None:
    a = _lat([float(x) for x in range(1, 101)])  # 1..100 ms, one each
    assert a.at_rank(1) == 1.0 and a.at_rank(100) == 100.0 and a.quantile(0.95) == 95.0
    low, up = order_ranks(100, 0.5, 0.975)
    assert a.bounds(0.5, 0.95) == (float(low), float(up))  # two-sided 95%: 97.5% a side
    dup = _lat([1.0, 1.0, 2.0, 3.0])
    assert [dup.at_rank(k) for k in (1, 2, 3, 4)] == [1.0, 1.0, 2.0, 3.0]


def test_ratio_interval_is_the_bonferroni_product_of_the_sides() -> None:
    a = _lat([float(x) for x in range(1, 101)])
    b = _lat([2.0 * x for x in range(1, 101)])
    low, up = order_ranks(100, 0.5, 1 - 0.05 / 4)  # each side at 97.5%, each tail 1.25%
    lo, hi = quantile_ratio(a, b, 0.5, 0.05)
    assert (lo, hi) == (2.0 * low / up, 2.0 * up / low)
    # No order statistic bounds p99 of 100 latencies from above at 98.75%: no upper bound.
    assert quantile_ratio(a, b, 0.99, 0.05)[1] == math.inf


def test_p_values_invert_the_intervals() -> None:
    a = _lat([float(x) for x in range(1, 1001)])
    assert p_different(lambda al: quantile_ratio(a, a, 0.5, al)) == 1.0
    b = _lat([1.5 * x for x in range(1, 1001)])
    p = p_different(lambda al: quantile_ratio(a, b, 0.5, al))
    assert p < 1e-6
    assert quantile_ratio(a, b, 0.5, p * 1.01)[0] > 1.0  # just above p: excludes 1
    assert quantile_ratio(a, b, 0.5, p / 1.01)[0] <= 1.0  # just below: does not
    # Identical sides of 1,000 are equivalent within ±20%, never within ±1%.
    assert p_equivalent(lambda al: quantile_ratio(a, a, 0.5, al), 0.2) < 0.01
    assert p_equivalent(lambda al: quantile_ratio(a, a, 0.5, al), 0.01) == 1.0


def test_repeats_are_a_ratio_of_geometric_means_with_welchs_interval() -> None:
    r = Repeats(a=(100.0, 110.0, 90.0), b=(200.0, 220.0, 180.0))
    assert math.isclose(r.point(), 2.0)
    lo, hi = r.ratio(0.05)
    assert lo < 2.0 < hi and math.isclose(lo * hi, 4.0)  # symmetric on the log scale
    assert p_different(r.ratio) < 0.05 and p_equivalent(r.ratio, 0.05) == 1.0
    same = Repeats(a=(100.0, 101.0, 99.0), b=(100.5, 100.0, 99.5))
    assert p_different(same.ratio) > 0.9 and p_equivalent(same.ratio, 0.05) < 0.05
    lo, hi = same.ratio(1e-12)  # t in the thousands: no overflow
    assert lo < 1e-10 and hi > 1e10
    assert not Repeats(a=(1.0,), b=(1.0, 2.0)).usable
    assert not Repeats(a=(3.0, 3.0), b=(3.0, 3.0)).usable


def test_a_difference_must_clear_the_margin() -> None:
    a = _lat([float(x) for x in range(1, 10001)])
    b = _lat([1.08 * x for x in range(1, 10001)])

    def iv(al: float) -> tuple[float, float]:
        return quantile_ratio(a, b, 0.5, al)

    # 95% interval [1.03, 1.13]: 8% slower is shown different from 1 ...
    assert p_different(iv) < 0.001
    assert p_different(iv, 0.05) > 0.05  # ... not at 95% beyond a ±5% margin
    assert p_different(iv, 0.1) == 1.0  # ... never beyond ±10%
    assert p_equivalent(iv, 0.2) < 1e-6  # and shown within ±20%


def test_batch_shares_give_the_spread_of_a_quantile_in_rank() -> None:
    """Four slices of 10 latencies; the run's median is 5 ms: the slices hold 10, 0, 10 and 0
    latencies at or below it; a p50 batch needs 10, so 4 batches, shares 1, 0, 1, 0: sd
    0.577, se 0.289."""
    from scalelab.lab.compare.batches import per_group, share_bounds, share_spread
    from scalelab.lab.load.slices import slice_blobs

    assert (per_group(0.5), per_group(0.95), per_group(0.99)) == (10, 100, 500)
    us = np.concatenate([np.full(10, v, dtype=np.int64) for v in (4000, 6000, 4000, 6000)])
    s = share_spread(slice_blobs(us, k=4), 0.5, 4.0)
    assert s is not None and s.batches == 4
    assert s.se == pytest.approx(0.5773503 / 2, rel=1e-6)
    values, counts = np.array([4.0, 6.0]), np.array([20, 20])
    # t(3) at 0.975 is 3.182: 0.5 ∓ 0.919 falls off both ends of the run.
    assert share_bounds(values, counts, 0.5, 0.95, s) == (0.0, math.inf)
    assert share_spread(slice_blobs(us[:19], k=4), 0.5, 4.0) is None  # 19 < 2 batches of 10
