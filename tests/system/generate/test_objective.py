"""Throughput at a p95 TPOT objective: exact TPOTs, quantiles and the selection rule."""

from __future__ import annotations

import math

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.generate.objective import (
    SweepPoint,
    TpotBound,
    best_under_objective,
    parse_objective,
    quantile,
    request_tpot,
)


def pt(setting: int, tps: float, tpot: float, mode: str = "continuous") -> SweepPoint:
    return SweepPoint(mode=mode, setting=setting, tokens_per_s=tps, p95_tpot_s=tpot)


def test_request_tpot_is_first_to_last_over_n_minus_one() -> None:
    # A first token that comes late (prefill) does not count: only the gaps after it.
    assert request_tpot([10.0, 10.5, 11.0, 12.5]) == pytest.approx(2.5 / 3)
    assert request_tpot([3.0, 3.25]) == 0.25
    assert request_tpot([7.0]) is None
    assert request_tpot([]) is None


def test_quantile_nearest_rank() -> None:
    vals = [float(v) for v in range(1, 21)]  # 1..20
    assert quantile(vals, 0.95) == 19.0  # round(0.95 * 19) = 18 -> the 19th value
    assert quantile(vals, 0.5) == 11.0  # round(9.5) = 10 (banker's) -> 11th
    assert quantile([4.0], 0.95) == 4.0
    assert math.isnan(quantile([], 0.95))


def test_best_is_fastest_point_within_the_bound() -> None:
    points = [pt(1, 10.0, 0.10), pt(4, 25.0, 0.20), pt(8, 33.0, 0.26), pt(12, 35.0, 0.31)]
    assert best_under_objective(points, 0.25) == points[1]
    assert best_under_objective(points, 0.26) == points[2]  # the bound itself meets it
    assert best_under_objective(points, 1.0) == points[3]
    assert best_under_objective(points, 0.05) is None


def test_tie_goes_to_the_smaller_setting() -> None:
    points = [pt(8, 30.0, 0.2), pt(4, 30.0, 0.2), pt(12, 29.0, 0.1)]
    assert best_under_objective(points, 0.3) == points[1]


def test_parse_objective_seconds_and_relative() -> None:
    assert parse_objective("0.25") == TpotBound(value=0.25)
    rel = parse_objective(" 2.5X ")
    assert rel == TpotBound(value=2.5, relative=True)
    assert rel.bound(0.1) == pytest.approx(0.25)
    assert TpotBound(value=0.3).bound(None) == 0.3
    assert str(rel) == "2.5x one-at-a-time" and str(TpotBound(value=0.25)) == "0.25 s"


@pytest.mark.parametrize("bad", ["fast", "", "x", "0", "-1", "-2x"])
def test_parse_objective_rejects_bad_values(bad: str) -> None:
    with pytest.raises(BadUsageError):
        parse_objective(bad)


def test_relative_objective_needs_the_reference() -> None:
    with pytest.raises(BadUsageError, match="keep 1 in --sweep"):
        TpotBound(value=2.0, relative=True).bound(None)
