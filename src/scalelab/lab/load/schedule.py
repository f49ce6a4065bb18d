"""Arrival schedules for open-loop load: when each request is due, in seconds from the start.

Pure functions of (rate, length, seed). The generator times every latency from these due times,
not from when it managed to send, so a stalled server cannot hide its stall by slowing the
generator down (no coordinated omission). Multi-process runs split one schedule round-robin, so
each process's share is itself an evenly spread schedule at rate/P.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.arrival import check_arrival, due_times

Arrival = Literal["constant", "poisson"]
ARRIVALS: tuple[Arrival, ...] = ("constant", "poisson")
"""The steady processes; `schedule` also draws arrival.py's (gamma:CV, PROCESS+ramp:STAGES,
replay:SPEED:PATH), named by a string the plans carry as they carry these."""
Mode = Literal["open", "closed"]
"""Open loop (requests due on a schedule) or closed loop (N clients, each awaiting its answer)."""
MAX_SCHEDULE = 50_000_000
"""Refuse schedules longer than this (400 MB of float64) rather than exhaust memory."""


def schedule(rate: float, *, duration_s: float | None = None, requests: int | None = None,
             arrival: str = "constant", seed: int = 0) -> np.ndarray:
    """Due times (float64 seconds, ascending, starting at 0) for `rate` requests/s.

    Give `duration_s` (all arrivals in [0, duration)) or `requests` (exactly that many).
    Constant arrivals are spaced 1/rate apart; Poisson arrivals have exponential gaps of mean
    1/rate drawn from `seed`, so the same seed gives the same schedule.
    """
    if not (rate > 0 and math.isfinite(rate)):
        raise BadUsageError(f"--rate must be a positive number of requests/s, got {rate}")
    if (duration_s is None) == (requests is None):
        raise BadUsageError("give exactly one of --duration or --requests")
    if arrival not in ARRIVALS:
        check_arrival(arrival)
    if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
        raise BadUsageError(f"--duration must be positive, got {duration_s}")
    if requests is not None and requests < 1:
        raise BadUsageError(f"--requests must be at least 1, got {requests}")
    expected = requests if requests is not None else math.ceil(rate * float(duration_s or 0))
    if expected > MAX_SCHEDULE:
        raise BadUsageError(
            f"{expected:,} requests is more than one run holds ({MAX_SCHEDULE:,}); "
            "lower --rate or --duration, or split the run"
        )
    if arrival not in ARRIVALS:
        return due_times(arrival, rate, duration_s=duration_s, requests=requests, seed=seed)
    if arrival == "constant":
        n = requests if requests is not None else math.ceil(rate * float(duration_s or 0) - 1e-9)
        return np.arange(n, dtype=np.float64) / rate
    rng = np.random.default_rng(seed)
    if requests is not None:
        gaps = rng.exponential(1.0 / rate, size=requests)
        gaps[0] = 0.0
        return np.cumsum(gaps)
    # Draw a little more than expected, then cut at the duration.
    assert duration_s is not None
    out: list[np.ndarray] = []
    t0 = 0.0
    while True:
        chunk = max(16, int(rate * duration_s * 1.1) + 16)
        gaps = rng.exponential(1.0 / rate, size=chunk)
        if not out:
            gaps[0] = 0.0
        times = t0 + np.cumsum(gaps)
        out.append(times)
        t0 = float(times[-1])
        if t0 >= duration_s:
            break
    allt = np.concatenate(out)
    return allt[allt < duration_s]


def split(times: np.ndarray, parts: int, index: int) -> np.ndarray:
    """The `index`-th of `parts` round-robin shares of a schedule (every parts-th due time)."""
    if parts < 1 or not (0 <= index < parts):
        raise BadUsageError(f"bad split {index} of {parts}")
    return times[index::parts]
