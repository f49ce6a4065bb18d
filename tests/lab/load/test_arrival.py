"""Arrival processes: gamma burstiness, k6-like ramps, replayed traces (lab/load/arrival.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.arrival import parse_ramp, ramp_length
from scalelab.lab.load.schedule import schedule


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_gaps_have_the_rate_and_the_coefficient_of_variation(cv: float) -> None:
    t = schedule(100.0, requests=200_000, arrival=f"gamma:{cv}", seed=3)
    gaps = np.diff(t)
    assert t[0] == 0.0
    assert math.isclose(gaps.mean(), 0.01, rel_tol=0.02)
    assert math.isclose(gaps.std() / gaps.mean(), cv, rel_tol=0.03)
    assert np.array_equal(t, schedule(100.0, requests=200_000, arrival=f"gamma:{cv}", seed=3))


def test_gamma_within_a_duration() -> None:
    t = schedule(50.0, duration_s=10.0, arrival="gamma:2", seed=1)
    assert t[-1] < 10.0 and 350 < len(t) < 650  # 500 expected; CV 2 spreads the count


def test_a_ramp_sends_the_area_under_its_rate() -> None:
    assert parse_ramp("30s:10,2m:50,30s:0") == [(30.0, 10.0), (120.0, 50.0), (30.0, 0.0)]
    assert ramp_length("10s:10,10s:10") == (20.0, 7.5)  # 50 + 100 requests over 20 s
    assert ramp_length("10s:10,10s:10", skip_s=5.0) == (20.0, 137.5 / 15)  # (37.5 + 100) / 15 s
    t = schedule(7.5, duration_s=20.0, arrival="constant+ramp:10s:10,10s:10")
    assert len(t) == 150
    flat = np.diff(t[t > 10.05])
    assert np.allclose(flat, 0.1, atol=1e-6)  # the held stage: 10/s evenly
    rising = t[t < 10.0]
    assert len(rising) == 50 and math.isclose(rising[-1], math.sqrt(2 * 49), abs_tol=1e-3)
    p = schedule(7.5, duration_s=20.0, arrival="poisson+ramp:10s:10,10s:10", seed=2)
    assert 100 < len(p) < 200 and p[-1] < 20.0


@pytest.mark.parametrize("bad", ["gamma:0", "gamma:x", "weibull", "poisson+ramp:10s",
                                 "constant+ramp:10s:-1", "constant+ramp:5s:0"])
def test_bad_arrivals_are_usage_errors(bad: str) -> None:
    with pytest.raises(BadUsageError):
        schedule(10.0, duration_s=1.0, arrival=bad)


def test_replay_is_the_trace_sped_up(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("timestamp,input_tokens,output_tokens\n103.5,10,5\n100,20,7\n101,30,9\n")
    t = schedule(1.0, duration_s=10.0, arrival=f"replay:2:{f}")
    assert t.tolist() == [0.0, 0.5, 1.75]
