"""Objectives: what each stage must keep as it scales, and checking sheet rows against them.

An objective names a metric of a sheet row and a bound: `{metric: p95_ms, max: 50}`,
`{metric: rate, min: 200000}`, `{metric: "quality:f1_macro", min: 0.4}`. Metrics:
rate, wall_s, p50_ms, p95_ms, p99_ms, failure_rate, availability (1 − failure rate),
peak_memory_bytes, cost_per_unit_usd, efficiency (rate per unit of the scaled variable relative
to the smallest level), quality:<key>, extras:<key>.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scalelab.lab.core.decide import (
    Decision,
    decide_point,
    decide_quantile,
    decide_rate,
    decide_spread,
)
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.sheet import SAMPLES_UNIT_KEY, SheetRow
from scalelab.lab.core.signals import LEGACY_EXTRAS

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
        """The point test (no confidence): None when the row has no value for the metric.
        A verdict decides with `decide` instead; this ranks alternatives by their values."""
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
        # The resource signals left extras for typed fields; objectives on their old names
        # (extras:cpu_busy_cores, extras:comm_share, ...) read the fields.
        lifted = LEGACY_EXTRAS.get(metric[7:])
        v = getattr(row.resources, lifted) if lifted else row.extras.get(metric[7:])
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    v = getattr(row, metric)
    return None if v is None else float(v)


_QUANTILE_METRICS = {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99}
_EXTRA_QUANTILE = re.compile(r"^extras:(?P<name>.+)_p(?P<q>50|90|95|99|999)_ms$")
_Q = {"50": 0.5, "90": 0.9, "95": 0.95, "99": 0.99, "999": 0.999}


def quantile_of(metric: str) -> float | None:
    """The latency quantile an objective's metric names (p95_ms -> 0.95,
    extras:tpot_p99_ms -> 0.99), or None for any other metric."""
    if metric in _QUANTILE_METRICS:
        return _QUANTILE_METRICS[metric]
    m = _EXTRA_QUANTILE.match(metric)
    return _Q[m["q"]] if m is not None else None


def _efficiency_spread(row: SheetRow, rows: list[SheetRow]) -> tuple[float | None, float | None]:
    """Efficiency of the row's slowest and fastest repeat against the base level's median."""
    ok = sorted((r for r in rows if r.rate is not None and r.rate > 0), key=lambda r: r.level)
    if not ok or row.rate_min is None or row.rate_max is None or not row.level:
        return None, None
    n0, x0 = ok[0].level, ok[0].rate
    assert x0 is not None
    scale = x0 * row.level / n0
    return row.rate_min / scale, row.rate_max / scale


def decide(row: SheetRow, o: Objective, series_rows: list[SheetRow] | None = None) -> Decision:
    """One objective at one row, by the rule its metric calls for (see core.decide)."""
    rows = series_rows or [row]
    value = metric_value(row, o.metric, rows)
    said = row.extras.get(SAMPLES_UNIT_KEY)
    unit = said if isinstance(said, str) and said else "requests"
    if o.metric in _QUANTILE_METRICS:
        return decide_quantile(_QUANTILE_METRICS[o.metric], row.quantiles_ms,
                               row.latency_samples, value=value, unit=unit,
        minimum=o.min, maximum=o.max)
    if (m := _EXTRA_QUANTILE.match(o.metric)) is not None:
        # A quantile kept in the extras (e.g. TPOT p95): bracketed by its recorded siblings.
        recorded = {
            q: float(v)
            for k, q in _Q.items()
            if isinstance(v := row.extras.get(f"{m['name']}_p{k}_ms"), int | float)
        }
        return decide_quantile(_Q[m["q"]], recorded, row.latency_samples, value=value,
                               unit=unit,
        minimum=o.min, maximum=o.max)
    if o.metric in ("failure_rate", "availability"):
        return decide_rate(row.failure_events, row.failure_trials, value=value,
                           complement=o.metric == "availability", unit=unit,
        minimum=o.min, maximum=o.max)
    if o.metric == "rate":
        return decide_spread(value, row.rate_min, row.rate_max, repeats=row.repeats,
        minimum=o.min, maximum=o.max)
    if o.metric == "efficiency":
        lo, hi = _efficiency_spread(row, rows)
        return decide_spread(value, lo, hi, repeats=row.repeats,
        minimum=o.min, maximum=o.max)
    return decide_point(value, repeats=row.repeats,
        minimum=o.min, maximum=o.max)


@dataclass(frozen=True, kw_only=True)
class Check:
    stage: str
    series: str
    level: float
    multiple: float
    objective: Objective
    decision: Decision
    """Met, missed, undecided or not measured, with its value, sample size and bounds."""

    @property
    def value(self) -> float | None:
        return self.decision.value

    @property
    def outcome(self) -> str:
        return self.decision.outcome


def check_rows(rows: list[SheetRow], objectives: list[Objective]) -> list[Check]:
    """Every objective at every level of one stage's series."""
    return [
        Check(
            stage=row.stage,
            series=row.series,
            level=row.level,
            multiple=row.multiple,
            objective=o,
            decision=decide(row, o, rows),
        )
        for row in sorted(rows, key=lambda r: r.level)
        for o in objectives
    ]


def first_miss(checks: list[Check]) -> Check | None:
    """The missed check at the lowest multiple (ties: the first objective listed)."""
    missed = [c for c in checks if c.outcome == "missed"]
    return min(missed, key=lambda c: c.multiple) if missed else None
