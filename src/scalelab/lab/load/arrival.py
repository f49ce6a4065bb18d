"""Arrival processes beyond a steady rate: bursty (gamma), ramped (k6-like stages) and replayed.

An arrival is named by one string, which the plans carry as they carry "constant" or
"poisson", and which records keep:

    gamma:CV              renewal process with gamma gaps of mean 1/rate and coefficient of
                          variation CV (1 is Poisson; 2 bursty; 0.5 smoother)
    PROCESS+ramp:STAGES   the rate ramps linearly stage by stage from 0 (k6's ramping
                          arrival rate), e.g. poisson+ramp:30s:10,2m:50,30s:0; PROCESS is
                          constant, poisson or gamma:CV
    replay:SPEED:PATH     the arrivals of a request trace (trace_file.py), sped up SPEED times

A ramp draws the process at rate 1 and maps it through the inverse of the cumulative rate
Λ(t) = ∫ rate: constant spacing becomes evenly spaced in Λ, Poisson an inhomogeneous Poisson
process (the time-change theorem).
"""

from __future__ import annotations

import math

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import parse_duration

PLAIN = ("constant", "poisson")


def parse_gamma(arrival: str) -> float:
    """gamma:CV -> CV (> 0)."""
    try:
        cv = float(arrival.split(":", 1)[1])
    except (IndexError, ValueError):
        cv = math.nan
    if not (cv > 0 and math.isfinite(cv)):
        raise BadUsageError(f"--arrival {arrival!r}: write gamma:CV with CV > 0, e.g. gamma:2 "
                            "(1 is Poisson)")
    return cv


def check_arrival(arrival: str) -> str:
    """`arrival` if it names a process this module draws; a one-line usage error otherwise."""
    base, _, ramp = arrival.partition("+ramp:")
    if ramp:
        parse_ramp(ramp)
    if base in PLAIN or arrival.startswith("replay:"):
        return arrival
    if base.startswith("gamma:"):
        parse_gamma(base)
        return arrival
    raise BadUsageError(f"--arrival {arrival!r}: use constant, poisson or gamma:CV")


def parse_ramp(text: str) -> list[tuple[float, float]]:
    """'30s:10,2m:50,30s:0' -> [(30, 10), (120, 50), (30, 0)]: (stage seconds, target rate)."""
    out = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        dur, sep, rate = part.rpartition(":")
        try:
            stage = (parse_duration(dur, what="--ramp stage"), float(rate))
        except (ValueError, BadUsageError):
            stage = (math.nan, math.nan)
        if not sep or not (stage[0] > 0 and stage[1] >= 0 and math.isfinite(stage[1])):
            raise BadUsageError(f"--ramp {part!r}: write DURATION:RATE stages, e.g. "
                                "30s:10,2m:50,30s:0")
        out.append(stage)
    if not out or max(r for _, r in out) <= 0:
        raise BadUsageError(f"--ramp {text!r}: needs at least one stage with a rate above 0")
    return out


def ramp_length(text: str, skip_s: float = 0.0) -> tuple[float, float]:
    """(total seconds, mean rate after the first `skip_s` seconds: the measured window's
    after a warm-up) of a ramp."""
    stages = parse_ramp(text)
    knots_t = np.cumsum([0.0] + [d for d, _ in stages])
    knots_r = np.asarray([0.0] + [r for _, r in stages])
    total = float(knots_t[-1])
    start = min(max(skip_s, 0.0), total)
    t = np.unique(np.concatenate([knots_t[knots_t > start], [start, total]]))
    r = np.interp(t, knots_t, knots_r)
    area = float(np.sum((r[1:] + r[:-1]) / 2.0 * np.diff(t)))  # exact: the rate is piecewise
    return total, (area / (total - start) if total > start else 0.0)  # linear between knots


def _unit_gaps(process: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n gaps of a rate-1 process (mean 1)."""
    if process == "constant":
        return np.ones(n)
    if process == "poisson":
        return rng.exponential(1.0, size=n)
    cv = parse_gamma(process)
    shape = 1.0 / (cv * cv)  # gamma(k, θ): mean kθ = 1, CV 1/√k
    return rng.gamma(shape, 1.0 / shape, size=n)


def renewal(process: str, rate: float, *, duration_s: float | None, requests: int | None,
            seed: int) -> np.ndarray:
    """Due times of a steady `process` at `rate`: the first at 0, then its gaps; all within
    [0, duration) or exactly `requests`."""
    rng = np.random.default_rng(seed)
    n = requests if requests is not None else math.ceil(rate * float(duration_s or 0) * 1.2) + 64
    while True:
        gaps = _unit_gaps(process, n, rng) / rate
        gaps[0] = 0.0
        t = np.cumsum(gaps)
        if requests is not None:
            return t
        assert duration_s is not None
        if t[-1] >= duration_s:
            return t[t < duration_s]
        n *= 2


def ramped(process: str, ramp: str, *, duration_s: float | None, seed: int) -> np.ndarray:
    """Due times of `process` under the ramp's rate: unit-rate arrivals through Λ⁻¹."""
    stages = parse_ramp(ramp)
    knots_t = np.cumsum([0.0] + [d for d, _ in stages])
    knots_r = np.asarray([0.0] + [r for _, r in stages])
    # Λ at each knot (trapezoids); between knots Λ is quadratic, inverted on a fine grid.
    grid = np.linspace(0.0, knots_t[-1], max(2, int(knots_t[-1] * 1000) + 1))  # 1 ms steps
    rate = np.interp(grid, knots_t, knots_r)
    lam = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2.0 * np.diff(grid))])
    total = float(lam[-1])
    rng = np.random.default_rng(seed)
    n = math.ceil(total * 1.2) + 64
    gaps = _unit_gaps(process, n, rng)
    gaps[0] = 0.0 if process == "constant" else gaps[0]
    units = np.cumsum(gaps)
    units = units[units < total * (1.0 - 1e-9)]  # [0, end): not one at Λ(end) by rounding
    t = np.interp(units, lam, grid)
    return t if duration_s is None else t[t < duration_s]


def replayed(spec: str, *, duration_s: float | None) -> np.ndarray:
    """replay:SPEED:PATH -> the trace's arrivals divided by SPEED."""
    from scalelab.lab.load.trace_file import read_trace

    speed, path = replay_parts(spec)
    t = read_trace(path).times_s / speed
    return t if duration_s is None else t[t < duration_s]


def replay_parts(spec: str) -> tuple[float, str]:
    _, speed, path = spec.split(":", 2)
    return float(speed), path


def due_times(arrival: str, rate: float, *, duration_s: float | None, requests: int | None,
              seed: int) -> np.ndarray:
    """Due times of any arrival this module draws (see the module doc)."""
    if arrival.startswith("replay:"):
        return replayed(arrival, duration_s=duration_s)
    base, _, ramp = arrival.partition("+ramp:")
    if ramp:
        return ramped(base, ramp, duration_s=duration_s, seed=seed)
    return renewal(base, rate, duration_s=duration_s, requests=requests, seed=seed)
