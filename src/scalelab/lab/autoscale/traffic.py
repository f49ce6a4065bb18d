"""Traffic curves (`--trace`) for the autoscaling simulator: (time s, rate req/s), linearly joined.

Not span traces (those are `observe/traces.py`). A CSV curve has a `time,rate` header (time in
seconds from the start, ascending; or any duration like 90s, 5m, 1h) and one row per point; a
request trace (`timestamp,...` header, one row a request: trace_file.py, what `load --replay`
sends) is binned into its rate curve.
Built-ins, scaled by a base and a peak rate:
- diurnal: 24 h, a smooth day (trough at 04:00, peak at 16:00) plus a 20% evening shoulder;
- spike: 1 h at the base with a jump to the peak at 20 min lasting 5 min;
- ramp: 1 h, linear from base to peak over 50 min, then held.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.trace_file import RequestTrace, is_request_trace, read_trace

BUILTINS = ("diurnal", "spike", "ramp")


@dataclass(frozen=True)
class TrafficCurve:
    """Rate points joined by straight lines; the rate holds after the last point."""

    name: str
    times_s: tuple[float, ...]
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times_s) != len(self.rates) or len(self.times_s) < 2:
            raise BadInputError(f"trace {self.name}: needs at least two (time, rate) points")
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise BadInputError(f"trace {self.name}: times must strictly increase")
        if any(not (math.isfinite(r) and r >= 0) for r in self.rates):
            raise BadInputError(f"trace {self.name}: rates must be finite and >= 0")

    @property
    def duration_s(self) -> float:
        return self.times_s[-1] - self.times_s[0]

    def rate_at(self, t: np.ndarray | float) -> np.ndarray:
        """Rate at times t (seconds from the trace's first point)."""
        return np.interp(np.asarray(t, dtype=float) + self.times_s[0], self.times_s, self.rates)


def read_traffic(path: str | Path) -> TrafficCurve:
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"--trace {p}: no such file; give a CSV with time,rate or one of "
                            f"{', '.join(BUILTINS)}")
    with p.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    if is_request_trace(header):
        return request_curve(read_trace(p))
    times: list[float] = []
    rates: list[float] = []
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        for lineno, row in enumerate(reader, start=1):
            if not row or not "".join(row).strip():
                continue
            if lineno == 1 and row[0].strip().lower() in ("time", "t", "time_s", "seconds"):
                continue
            if len(row) < 2:
                raise BadInputError(f"{p}:{lineno}: need two columns time,rate")
            try:
                t = parse_duration(row[0].strip(), what=f"{p}:{lineno} time")
                r = float(row[1])
            except (ValueError, BadInputError):
                raise BadInputError(f"{p}:{lineno}: {row[:2]} is not a time and a rate") from None
            times.append(t)
            rates.append(r)
    return TrafficCurve(p.stem, tuple(times), tuple(rates))


REQUEST_BINS = 100
"""A request trace becomes a rate curve of about this many bins (whole seconds, 1 to 60 each)."""


def request_curve(trace: RequestTrace) -> TrafficCurve:
    """A request trace (one row a request, trace_file.py) as the rate curve of its arrivals,
    binned: what `load --replay` sends, as `autoscale simulate` replays it."""
    bin_s = float(min(60, max(1, math.ceil(trace.span_s / REQUEST_BINS))))  # whole seconds
    if trace.span_s < 2 * bin_s:
        raise BadInputError(f"trace {trace.name}: spans {trace.span_s:.3g} s; a rate curve "
                            f"needs at least {2 * bin_s:g} s of arrivals")
    times, rates = trace.rate_curve(bin_s)
    return TrafficCurve(trace.name, times, rates)


def builtin(name: str, *, base: float, peak: float) -> TrafficCurve:
    if not (0 <= base <= peak and peak > 0):
        raise BadUsageError(f"trace rates need 0 <= base ({base}) <= peak ({peak}), peak > 0")
    if name == "diurnal":
        t = np.arange(0, 86400 + 1, 300, dtype=float)
        h = t / 3600.0
        day = (1 - np.cos(2 * np.pi * (h - 4.0) / 24.0)) / 2  # 0 at 04:00, 1 at 16:00
        evening = 0.2 * np.exp(-((h - 20.5) ** 2) / 2.0)
        shape = np.clip(day + evening, 0, None)
        shape = shape / shape.max()
        return TrafficCurve("diurnal", tuple(t.tolist()),
                            tuple((base + (peak - base) * shape).tolist()))
    if name == "spike":
        return TrafficCurve("spike", (0.0, 1200.0, 1201.0, 1500.0, 1501.0, 3600.0),
                            (base, base, peak, peak, base, base))
    if name == "ramp":
        return TrafficCurve("ramp", (0.0, 3000.0, 3600.0), (base, peak, peak))
    raise BadUsageError(f"--trace {name!r}: not a file and not a built-in "
                        f"({', '.join(BUILTINS)})")


def load_traffic(spec: str, *, base: float, peak: float) -> TrafficCurve:
    """A built-in name or a CSV path."""
    if spec in BUILTINS:
        return builtin(spec, base=base, peak=peak)
    return read_traffic(spec)
