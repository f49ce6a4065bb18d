"""Objectives: what each stage must keep as it scales, and checking sheet rows against them.

An objective names a metric of a sheet row and a bound: `{metric: p95_ms, max: 50}`,
`{metric: rate, min: 200000}`, `{metric: "quality:f1_macro", min: 0.4}`. Metrics:
rate, wall_s, p50_ms, p95_ms, p99_ms, failure_rate, availability (1 − failure rate),
peak_memory_bytes, cost_per_unit_usd, efficiency (rate per unit of the scaled variable relative
to the smallest level), quality:<key>, extras:<key>.

The same objectives in the load testers' words (`--slo`) have one grammar, read here by
`read_term`: comma-separated terms `pQ<THRESHOLD` (a request's latency quantile; ms when no unit
is given), `METRIC_pQ<THRESHOLD` for a token timing (ttft, itl, tpot, e2e), `avail>=P%` and
`errors<P%`. `Objective.to_slo` writes an objective as such a term and `Objective.from_slo`
reads one back; load/slo.py (`Slo`) and load/llm/token_slo.py (`TokenSlo`) build on
`read_term`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from scalelab.lab.core.decide import (
    Decision,
    decide_point,
    decide_quantile,
    decide_rate,
    decide_spread,
)
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.sheet import SAMPLES_UNIT_KEY, SheetRow
from scalelab.lab.core.signals import LEGACY_EXTRAS
from scalelab.lab.core.units import parse_duration

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
ENERGY_ROW_FIELDS = ("energy_j", "energy_per_unit_j")
"""The energy extras of records written before `Record.energy`: the sheet row's fields of the
same name hold them now (objectives on extras:energy_j keep meaning what they meant)."""
QUANTILE_OF = {"p50_ms": 0.5, "p90_ms": 0.9, "p95_ms": 0.95, "p99_ms": 0.99}
"""The latency-quantile metric names and their quantiles (p90_ms is a record's, not an
objective's: objectives take the METRICS above)."""
TIMINGS = ("ttft", "itl", "tpot", "e2e")
"""Token timings a `--slo` term may name (`ttft_p95<500ms`)."""


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


    @property
    def quantile(self) -> float | None:
        """0.95 for a `p95_ms` objective; None for any other metric."""
        return QUANTILE_OF.get(self.metric)

    def to_slo(self, of: str | None = None) -> str:
        """This objective as a `--slo` term: p95_ms ≤ 50 -> "p95<50ms" ("ttft_p95<50ms" with
        `of="ttft"`); availability ≥ 0.999 -> "avail>=99.9%". Inverse of `from_slo`."""
        if self.quantile is not None and self.max is not None:
            return f"{of + '_' if of else ''}{self.metric.removesuffix('_ms')}<{self.max:g}ms"
        if self.metric == "availability" and self.min is not None:
            return f"avail>={self.min * 100:.10g}%"
        raise BadUsageError(f"objective {self.label!r} has no --slo term; only a latency "
                            "quantile's max (p50_ms, p95_ms, p99_ms) and availability's min do")

    @classmethod
    def from_slo(cls, term: str, of: str | None = None) -> Objective:
        """The objective a `--slo` term states ("p99<20ms", "avail>=99.9%"; with `of`, a token
        timing's term such as "ttft_p95<500ms"). Inverse of `to_slo`."""
        t = read_term(term)
        if t is None or t.of != of:
            want = f"{of}_p95<500ms" if of else "p99<20ms"
            raise BadUsageError(f"cannot read {term!r} as an objective; write e.g. {want} or "
                                "avail>=99.9%")
        if t.quantile is None:
            return cls(metric="availability", min=t.availability)
        metric = next((m for m, q in QUANTILE_OF.items() if q == t.quantile and m in METRICS),
                      None)
        if metric is None or t.threshold_s is None:
            raise BadUsageError(f"{term!r}: objectives take p50, p95 or p99")
        return cls(metric=metric, max=round(t.threshold_s * 1e3, 9))

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
        # The resource signals and the energy left extras for typed fields; objectives on
        # their old names (extras:cpu_busy_cores, extras:energy_per_unit_j, ...) read them.
        key = metric[7:]
        lifted = LEGACY_EXTRAS.get(key)
        v = (getattr(row.resources, lifted) if lifted
             else getattr(row, key) if key in ENERGY_ROW_FIELDS else row.extras.get(key))
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    v = getattr(row, metric)
    return None if v is None else float(v)


_EXTRA_QUANTILE = re.compile(r"^extras:(?P<name>.+)_p(?P<q>50|90|95|99|999)_ms$")
_Q = {"50": 0.5, "90": 0.9, "95": 0.95, "99": 0.99, "999": 0.999}


def quantile_of(metric: str) -> float | None:
    """The latency quantile an objective's metric names (p95_ms -> 0.95,
    extras:tpot_p99_ms -> 0.99), or None for any other metric."""
    if metric in QUANTILE_OF:
        return QUANTILE_OF[metric]
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
    if o.metric in QUANTILE_OF:
        return decide_quantile(QUANTILE_OF[o.metric], row.quantiles_ms,
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


def latency_objectives(objectives: Sequence[Objective]) -> list[Objective]:
    """The latency-quantile objectives with a max, in order (what a load test judges)."""
    return [o for o in objectives if o.quantile is not None and o.max is not None]


def slo_text(objectives: Sequence[Objective], *, of: str | None = None,
             availability: bool = True) -> str | None:
    """One `--slo` for a capacity search from a stage's objectives: the first latency
    quantile's term and, with `availability`, the availability objective's; None without a
    latency objective."""
    lat = latency_objectives(objectives)
    if not lat:
        return None
    terms = [lat[0].to_slo(of)]
    avail = next((o for o in objectives if o.metric == "availability" and o.min is not None),
                 None)
    if availability and avail is not None:
        terms.append(avail.to_slo())
    return ",".join(terms)


# -- the text grammar -----------------------------------------------------------------------
_LAT = re.compile(rf"^(?:(?P<of>{'|'.join(TIMINGS)})_?)?p(?P<q>\d+(?:\.\d+)?)\s*(?:<=|<)"
                  r"\s*(?P<thr>.+)$", re.IGNORECASE)
_AVAIL = re.compile(r"^(?:avail|availability)\s*(?:>=|>)\s*(.+)$", re.IGNORECASE)
_ERRS = re.compile(r"^(?:errors?|error[_-]?rate)\s*(?:<=|<)\s*(.+)$", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class Term:
    """One `--slo` term, read: a latency quantile under a threshold, or an availability."""

    of: str | None = None
    """The token timing it bounds (ttft, itl, tpot, e2e); None: a request's latency."""
    quantile: float | None = None
    """In (0, 1); None for an availability term."""
    threshold_s: float | None = None
    availability: float | None = None
    """Share of requests that must succeed (an availability or errors term)."""


def read_term(term: str) -> Term | None:
    """One term of the grammar in the module docstring, or None when it is none of its forms
    (a malformed number in a term of a known form raises BadUsageError)."""
    if m := _LAT.match(term.strip()):
        return Term(of=m["of"].lower() if m["of"] else None,
                    quantile=parse_quantile(m["q"], term),
                    threshold_s=parse_threshold(m["thr"], term))
    if m := _AVAIL.match(term.strip()):
        return Term(availability=parse_availability(m.group(1), term))
    if m := _ERRS.match(term.strip()):
        return Term(availability=round(1.0 - parse_percent(m.group(1), what=f"--slo {term!r}"),
                                       12))
    return None


T = TypeVar("T")


def parse_terms(text: str | None, read: Callable[[str], T | float | None],
                example: str) -> tuple[list[T], float | None]:
    """Split `--slo` at commas and read each term with `read`: an objective, an availability
    (a float; the last one wins) or None for a term it cannot read (an error naming
    `example`)."""
    objs: list[T] = []
    avail: float | None = None
    for term in [t.strip() for t in (text or "").split(",") if t.strip()]:
        got = read(term)
        if got is None:
            raise BadUsageError(f"--slo: cannot read {term!r}; write e.g. {example}, "
                                "comma-separated")
        if isinstance(got, float):
            avail = got
        else:
            objs.append(got)
    return objs, avail


def parse_quantile(digits: str, term: str) -> float:
    """The percentile of "p95" (0.95), "p99.9" or its usual shorthand "p999" (both 0.999)."""
    q = float(digits) / 100.0 if "." in digits or len(digits) <= 2 else \
        float(f"{digits[:2]}.{digits[2:]}") / 100.0
    q = round(q, 12)
    if not (0.0 < q < 1.0):
        raise BadUsageError(f"--slo {term!r}: the percentile must be between 0 and 100")
    return q


def parse_threshold(text: str, term: str) -> float:
    """An objective's threshold in seconds (milliseconds when no unit is given)."""
    thr = parse_duration(text, what=f"--slo {term!r}", default_unit="ms")
    if thr <= 0:
        raise BadUsageError(f"--slo {term!r}: the threshold must be positive")
    return thr


def parse_availability(text: str, term: str) -> float:
    """"99.9%" (or "99.9") of an "avail>=" term -> 0.999."""
    t = text.strip().rstrip("%")
    try:
        v = float(t)
    except ValueError:
        raise BadUsageError(f"--slo {term!r}: write availability as a percentage, e.g. 99.9%") \
            from None
    if not (0 < v <= 100):
        raise BadUsageError(f"--slo {term!r}: availability must be in (0, 100]%")
    return round(v / 100.0, 12)


def parse_percent(text: str, *, what: str) -> float:
    """'0.1%' -> 0.001; '0.001' -> 0.001."""
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise BadUsageError(f"{what}: {text!r} is not a percentage; write e.g. 0.1%") from None
    if not (0.0 <= v < 1.0) or not math.isfinite(v):
        raise BadUsageError(f"{what}: {text!r} must be between 0% and 100%")
    return v
