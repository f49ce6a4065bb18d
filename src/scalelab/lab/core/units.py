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
    """Seconds for people, 3 significant digits: 0.0123 -> '12.3 ms', 30.56 -> '30.6 s',
    300 -> '5 min', 7200 -> '2 h'."""
    if not math.isfinite(seconds):
        return "∞"
    if seconds < 1e-3:
        return f"{sig(seconds * 1e6)} µs"
    if seconds < 1:
        return f"{sig(seconds * 1e3)} ms"
    if seconds < 120:
        return f"{sig(seconds)} s"
    if seconds < 7200:
        return f"{sig(seconds / 60)} min"
    return f"{sig(seconds / 3600)} h"


def sig(v: float, digits: int = 3) -> str:
    """`v` to `digits` significant digits in plain decimals, never an exponent:
    70350 -> '70400', 4.33333 -> '4.33', 0.000123 -> '0.000123', 2.0 -> '2'."""
    if not math.isfinite(v):
        return "∞" if v > 0 else "-∞" if v < 0 else "—"
    if v == 0:
        return "0"
    exp = math.floor(math.log10(abs(v)))
    places = max(0, digits - 1 - exp)
    text = f"{round(v, digits - 1 - exp):.{places}f}"  # 999.6 -> '1000': the zeros go below
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_number(v: float | None, unit: str = "", digits: int = 3) -> str:
    """A number for people: 3 significant digits, k/M/G/T past a thousand, then the unit:
    70350 samples/s -> '70.4k samples/s', 0.2373 -> '0.237'; None -> '—'."""
    if v is None:
        return "—"
    text = sig(v, digits)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if math.isfinite(v) and abs(float(sig(v, digits))) >= div:
            text = sig(v / div, digits) + suffix
            break
    return f"{text} {unit}" if unit else text


def format_bytes(n: float) -> str:
    """Bytes for people, 3 significant digits in binary units: 3.399e8 -> '324 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(float(sig(n))) < 1024 or unit == "TiB":
            return f"{sig(n)} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    raise AssertionError("unreachable")


def format_multiple(m: float | None) -> str:
    """A multiple of load: 4.33333 -> '4.33×', 10 -> '10×'; None -> '—'."""
    return "—" if m is None else f"{sig(m)}×"


def format_percent(share: float | None) -> str:
    """A share as a percentage to 3 significant digits: 0.9994 -> '99.9%', 0.000012 ->
    '0.0012%', 0 -> '0%'; a share within 3 digits of 1 but not 1 keeps the digits that
    differ (0.99995 -> '99.995%'), so 'availability 100%' is said only of no failure."""
    if share is None:
        return "—"
    pct = share * 100
    text = sig(pct)
    if share != 1 and text == "100":
        text = f"{pct:.6f}".rstrip("0")
        keep = next(i for i, ch in enumerate(text.split(".")[1]) if ch != "9") + 1
        text = f"{pct:.{keep}f}"
    return f"{text}%"


def format_ms(v: float | None) -> str:
    """A latency in milliseconds, 3 significant digits: 41.234 -> '41.2 ms', 2300 -> '2.3 s'."""
    if v is None:
        return "—"
    return f"{sig(v / 1000)} s" if abs(v) >= 1000 else f"{sig(v)} ms"


def format_usd(v: float | None) -> str:
    return "—" if v is None else f"${format_number(v)}"


def format_metric(metric: str, v: float | None) -> str:
    """An objective's value in its own unit: bytes, ms, a share, dollars, or a number."""
    if v is None:
        return "—"
    if metric.endswith("_bytes"):
        return format_bytes(v)
    if metric.endswith("_ms"):
        return format_ms(v)
    if metric in ("availability", "failure_rate", "efficiency") or metric.endswith("_share"):
        return format_percent(v)
    if metric == "cost_per_unit_usd":
        return format_usd(v)
    if metric == "wall_s":
        return f"{sig(v)} s"
    return format_number(v)


def format_si(v: float | None, digits: int = 3) -> str:
    """A number for a narrow column: 1234 -> '1.23k', 2.5e6 -> '2.5M'; None -> '—'."""
    return format_number(v, digits=digits)
