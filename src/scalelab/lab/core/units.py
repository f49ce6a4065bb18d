"""Parsing and formatting of durations and sizes given on the command line or in config."""

from __future__ import annotations

import math
import re

from scalelab.lab.core.errors import BadInputError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s|sec|m|min|h|hr|d)?\s*$")
_DURATION_UNITS = {
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_duration(text: str, *, what: str = "duration", default_unit: str = "s") -> float:
    """'5m' -> 300.0 seconds; a bare number is in `default_unit`."""
    m = _DURATION.match(str(text))
    if not m:
        raise BadInputError(
            f"{what}: {text!r} is not a duration; "
            "write a number with a unit, e.g. 30s, 5m, 24h, 10ms"
        )
    return float(m.group(1)) * _DURATION_UNITS[m.group(2) or default_unit]


def parse_size(text: str, *, what: str = "size") -> int:
    """'2GiB' -> 2147483648 bytes; a bare number is bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise BadInputError(f"{what}: {text!r} is not a size; write e.g. 512MiB, 2GiB, 1000000")
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()])


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "∞"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_si(v: float | None, digits: int = 3) -> str:
    """A number for a narrow column: 1234 -> '1.23k', 2.5e6 -> '2.5M'; None -> '—'."""
    if v is None:
        return "—"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.{digits}g}{suffix}"
    return f"{v:.{digits}g}"
