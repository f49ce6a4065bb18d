"""Young's and Daly's intervals and Daly's wall-time model, with exact figures."""

from __future__ import annotations

import math

import pytest

from scalelab.lab.core.checkpoint import (
    daly_interval,
    expected_wall_time,
    interval_cost,
    plan_checkpoints,
    segment_time,
    young_interval,
)
from scalelab.lab.core.errors import BadInputError

DELTA, M = 300.0, 86400.0  # 5 min save, 24 h MTBF


def test_young_is_sqrt_2_delta_m_exactly() -> None:
    assert young_interval(DELTA, M) == 7200.0  # sqrt(2 × 300 × 86400) = sqrt(51 840 000)


def test_daly_higher_order_interval() -> None:
    # δ/(2M) = 1/576, its root 1/24: 7200 × (1 + 1/72 + 1/5184) − 300 = 7000 + 25/18.
    assert daly_interval(DELTA, M) == pytest.approx(7000 + 25 / 18, rel=1e-14)
    assert daly_interval(2 * M, M) == M and daly_interval(3 * M, M) == M


def test_daly_sits_at_the_optimum_of_the_wall_time_model() -> None:
    # Golden-section search for the τ minimising E(τ)/τ; Daly's estimate is within 1e-5.
    lo, hi = 1000.0, 20000.0
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if segment_time(a, DELTA, M) / a < segment_time(b, DELTA, M) / b:
            hi = b
        else:
            lo = a
    assert daly_interval(DELTA, M) == pytest.approx((lo + hi) / 2, rel=1e-5)


def test_wall_time_model_and_lost_fractions() -> None:
    tau, r, work = 7200.0, 600.0, 500 * 3600.0
    e = M * math.exp(r / M) * (math.exp((tau + DELTA) / M) - 1)
    assert segment_time(tau, DELTA, M, r) == pytest.approx(e, rel=1e-13)
    tw = expected_wall_time(work, tau, DELTA, M, r)
    assert tw == pytest.approx(e * work / tau, rel=1e-13)
    c = interval_cost("young", tau, DELTA, M, r, work)
    assert c.lost_fraction == pytest.approx(1 - work / tw, rel=1e-12)
    assert c.checkpoint_fraction + c.failure_fraction == pytest.approx(c.lost_fraction)
    assert (c.checkpoints, c.failures) == (250.0, pytest.approx(tw / M))
    assert c.lost_fraction == pytest.approx(0.0874233197, rel=1e-8)


def test_plan_reports_both_and_daly_loses_less() -> None:
    p = plan_checkpoints(DELTA, M, 600.0, 500 * 3600.0)
    assert p.young.interval_s == 7200.0
    assert p.daly.lost_fraction < p.young.lost_fraction
    assert p.daly.wall_time_s is not None and p.young.wall_time_s is not None
    assert p.daly.wall_time_s < p.young.wall_time_s
    assert plan_checkpoints(DELTA, M).young.wall_time_s is None


@pytest.mark.parametrize("args", [(0, M), (DELTA, 0), (-1, M), (math.inf, M), (DELTA, math.nan)])
def test_bad_durations(args: tuple[float, float]) -> None:
    with pytest.raises(BadInputError, match="positive duration"):
        plan_checkpoints(*args)
    with pytest.raises(BadInputError, match="restart"):
        plan_checkpoints(DELTA, M, restart_s=-1)
