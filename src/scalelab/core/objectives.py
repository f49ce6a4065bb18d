"""Objectives: what each stage must keep as it scales, and checking sheet rows against them.

An objective names a metric of a sheet row and a bound: `{metric: p95_ms, max: 50}`,
`{metric: rate, min: 200000}`, `{metric: "quality:f1_macro", min: 0.4}`. Metrics:
rate, wall_s, p50_ms, p95_ms, p99_ms, failure_rate, availability (1 − failure rate),
peak_memory_bytes, cost_per_unit_usd, efficiency (rate per unit of the scaled variable relative
to the smallest level), quality:<key>, extras:<key>.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.core.errors import BadInputError
from scalelab.core.sheet import SheetRow

METRICS = {
    "rate",
    "wall_s",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "failure_rate",
    "availability",
    "peak_memory_bytes",
    "cost_per_unit_usd",
    "efficiency",
}


@dataclass(frozen=True, kw_only=True)
class Objective:
    metric: str
    min: float | None = None
    max: float | None = None
    label: str = ""
    """How people say it, e.g. 'p95 ≤ 50 ms'; generated when empty."""

    def __post_init__(self) -> None:
        if self.metric not in METRICS and not self.metric.startswith(("quality:", "extras:")):
            raise BadInputError(
                f"unknown objective metric {self.metric!r}; use one of "
                f"{', '.join(sorted(METRICS))}, quality:<key> or extras:<key>"
            )
        if (self.min is None) == (self.max is None):
            raise BadInputError(f"objective {self.metric!r} needs exactly one of min or max")
        if not self.label:
            op, v = ("≥", self.min) if self.min is not None else ("≤", self.max)
            object.__setattr__(self, "label", f"{self.metric} {op} {v:g}")

    def passes(self, value: float | None) -> bool | None:
        """None when the row has no value for the metric (not measured: neither pass nor fail)."""
        if value is None:
            return None
        if self.min is not None:
            return value >= self.min
        assert self.max is not None
        return value <= self.max

    def margin(self, value: float) -> float:
        """Relative slack: > 0 inside the objective, < 0 outside (e.g. 0.2 = 20% headroom)."""
        bound = self.min if self.min is not None else self.max
        assert bound is not None
        if self.metric == "availability" and self.min is not None and self.min < 1:
            # Headroom of an availability objective is the error budget left, not the
            # distance between 99.95% and 99.9%.
            return 1.0 - (1.0 - value) / (1.0 - self.min)
        if bound == 0:
            return 0.0
        return (
            (value - bound) / abs(bound) if self.min is not None else (bound - value) / abs(bound)
        )


def efficiency(rows: list[SheetRow]) -> dict[float, float]:
    """Rate per unit of the variable, relative to the smallest level, per level."""
    ok = sorted((r for r in rows if r.rate is not None and r.rate > 0), key=lambda r: r.level)
    if not ok:
        return {}
    n0, x0 = ok[0].level, ok[0].rate
    assert x0 is not None
    return {r.level: (r.rate / x0) / (r.level / n0) for r in ok if r.rate is not None}


def metric_value(
    row: SheetRow, metric: str, series_rows: list[SheetRow] | None = None
) -> float | None:
    if metric == "availability":
        return None if row.failure_rate is None else 1.0 - row.failure_rate
    if metric == "efficiency":
        return efficiency(series_rows or [row]).get(row.level)
    if metric.startswith("quality:"):
        return row.quality.get(metric[8:])
    if metric.startswith("extras:"):
        v = row.extras.get(metric[7:])
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    v = getattr(row, metric)
    return None if v is None else float(v)


@dataclass(frozen=True, kw_only=True)
class Check:
    stage: str
    series: str
    level: float
    multiple: float
    objective: Objective
    value: float | None
    ok: bool | None


def check_rows(rows: list[SheetRow], objectives: list[Objective]) -> list[Check]:
    """Every objective at every level of one stage's series."""
    out: list[Check] = []
    for row in sorted(rows, key=lambda r: r.level):
        for o in objectives:
            v = metric_value(row, o.metric, rows)
            out.append(
                Check(
                    stage=row.stage,
                    series=row.series,
                    level=row.level,
                    multiple=row.multiple,
                    objective=o,
                    value=v,
                    ok=o.passes(v),
                )
            )
    return out


def first_miss(checks: list[Check]) -> Check | None:
    """The failing check at the lowest multiple (ties: the first objective listed)."""
    failing = [c for c in checks if c.ok is False]
    return min(failing, key=lambda c: c.multiple) if failing else None
