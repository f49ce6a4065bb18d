"""Windows over event time, as pure functions of integer microseconds (no I/O, exact).

- tumbling by time: window k holds [origin + k * period, origin + (k + 1) * period);
- sliding by time: the `size` before an instant;
- sliding by count: the last `size` rows before an instant.

The updater decides at tumbling-window closes (its tick) and trains on a sliding window (its
lookback), so "update weekly on the last 7 days" and "update daily on the last 5,000 labelled
flights" are both one WindowSpec each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from scalelab.lab.core.errors import BadInputError

HOUR_US = 3_600_000_000


@dataclass(frozen=True, kw_only=True)
class WindowSpec:
    """A sliding window: the last `size` hours (kind 'time') or rows (kind 'count')."""

    kind: Literal["time", "count"] = "time"
    size: float = 168.0

    def __post_init__(self) -> None:
        if self.kind not in ("time", "count"):
            raise BadInputError(f"window kind {self.kind!r} must be time or count")
        if not self.size > 0:
            raise BadInputError(f"window size must be > 0, got {self.size}")


def tumbling_index(times_us: np.ndarray, origin_us: int, period_us: int) -> np.ndarray:
    """The tumbling window each time falls in (floor division; times before origin < 0)."""
    if period_us <= 0:
        raise BadInputError(f"window period must be > 0, got {period_us} us")
    return np.floor_divide(np.asarray(times_us, dtype=np.int64) - origin_us, period_us)


def closes(origin_us: int, end_us: int, period_us: int) -> np.ndarray:
    """Window close instants origin + period, origin + 2 period, ... up to the first >= end."""
    if period_us <= 0:
        raise BadInputError(f"window period must be > 0, got {period_us} us")
    n = max(1, -(-(end_us - origin_us) // period_us))
    return origin_us + period_us * np.arange(1, n + 1, dtype=np.int64)


def sliding_mask(times_us: np.ndarray, eligible: np.ndarray, end_us: int,
                 spec: WindowSpec) -> np.ndarray:
    """Rows in the sliding window that closes at `end_us` (exclusive), among `eligible` ones.

    `times_us` must be sorted ascending (the stream's time order); a count window takes the
    last `size` eligible rows before `end_us`."""
    t = np.asarray(times_us, dtype=np.int64)
    before = eligible & (t < end_us)
    if spec.kind == "time":
        return before & (t >= end_us - int(spec.size * HOUR_US))
    idx = np.flatnonzero(before)[-int(spec.size):]
    out = np.zeros(t.shape, dtype=bool)
    out[idx] = True
    return out
