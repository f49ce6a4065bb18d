"""Service-level objectives for load results: parse "p95<50ms", error budgets, burn rates.

An SLO here is latency objectives (the q-quantile of successful requests' latency under a
threshold: equivalently at most 1 - q of them slower) plus an optional availability target (at
most an error budget of failed requests). For one measured level, each objective's bad-event
fraction divided by its allowance is the burn rate: 1 spends the budget exactly over the SLO
period, 10 spends a 30-day budget in 3 days.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.histogram import LatencyHistogram

_LAT = re.compile(r"^p(\d+(?:\.\d+)?)\s*(<=|<)\s*(.+)$", re.IGNORECASE)
_AVAIL = re.compile(r"^(?:avail|availability)\s*(>=|>)\s*(.+)$", re.IGNORECASE)
_ERRS = re.compile(r"^(?:errors?|error[_-]?rate)\s*(<=|<)\s*(.+)$", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class LatencyObjective:
    """The `quantile` of successful requests' latency must stay at or under `threshold_s`."""

    quantile: float
    """In (0, 1): 0.95 for p95."""
    threshold_s: float
    """Seconds."""

    @property
    def label(self) -> str:
        return f"p{self.quantile * 100:g}<{self.threshold_s * 1e3:g}ms"


ObjT = TypeVar("ObjT", bound=LatencyObjective)


@dataclass(frozen=True, kw_only=True)
class ObjectiveSet(ABC, Generic[ObjT]):
    """Latency objectives and an optional availability target: what `Slo` (a request's
    latency) and `llm.token_slo.TokenSlo` (token timings) both are."""

    availability: float | None = None
    """Share of requests that must succeed, e.g. 0.999; None: no availability objective."""

    needs: ClassVar[str] = "an SLO needs a latency objective (p95<50ms) or an availability " \
        "target (--error-budget 0.1%)"
    """The error when neither is given."""

    @property
    @abstractmethod
    def terms(self) -> tuple[ObjT, ...]:
        """The latency objectives."""

    def __post_init__(self) -> None:
        if not self.terms and self.availability is None:
            raise BadUsageError(self.needs)

    @property
    def error_budget(self) -> float | None:
        return None if self.availability is None else 1.0 - self.availability

    @property
    def label(self) -> str:
        return slo_label([o.label for o in self.terms], self.availability)


@dataclass(frozen=True, kw_only=True)
class Slo(ObjectiveSet[LatencyObjective]):
    """Latency objectives and an optional availability target."""

    latency: tuple[LatencyObjective, ...]
    """Latency objectives (may be empty when only availability is set)."""

    @property
    def terms(self) -> tuple[LatencyObjective, ...]:
        return self.latency


def slo_label(objectives: list[str], availability: float | None) -> str:
    """The objectives' labels and the availability target, as `--slo` takes them back."""
    if availability is not None:
        objectives = [*objectives, f"avail>={availability * 100:g}%"]
    return ",".join(objectives)


def parse_terms(text: str | None, read: Callable[[str], ObjT | float | None],
                example: str) -> tuple[list[ObjT], float | None]:
    """Split `--slo` at commas and read each term with `read`: an objective, an availability
    (a float; the last one wins) or None for a term it cannot read (an error naming
    `example`)."""
    objs: list[ObjT] = []
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
    return round(_pct(text, term) / 100.0, 12)


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


def parse_slo(text: str | None, *, error_budget: str | None = None) -> Slo:
    """Parse "p95<50ms,p99<200ms,avail>=99.9%" (comma-separated; any order).

    `error_budget` ("0.1%") sets availability = 1 - budget and overrides one in `text`.
    """
    lat, avail = parse_terms(text, _read_term, "\"p95<50ms\", \"p99<=0.2s\", "
                             "\"avail>=99.9%\" or \"errors<0.1%\"")
    if error_budget is not None:
        avail = round(1.0 - parse_percent(error_budget, what="--error-budget"), 12)
    return Slo(latency=tuple(lat), availability=avail)


def _read_term(term: str) -> LatencyObjective | float | None:
    if m := _LAT.match(term):
        return LatencyObjective(quantile=parse_quantile(m.group(1), term),
                                threshold_s=parse_threshold(m.group(3), term))
    if m := _AVAIL.match(term):
        return parse_availability(m.group(2), term)
    if m := _ERRS.match(term):
        return round(1.0 - parse_percent(m.group(2), what=f"--slo {term!r}"), 12)
    return None


def _pct(text: str, term: str) -> float:
    t = text.strip().rstrip("%")
    try:
        v = float(t)
    except ValueError:
        raise BadUsageError(f"--slo {term!r}: write availability as a percentage, e.g. 99.9%") \
            from None
    if not (0 < v <= 100):
        raise BadUsageError(f"--slo {term!r}: availability must be in (0, 100]%")
    return v


@dataclass(frozen=True, kw_only=True)
class BudgetLine:
    """One objective at one level."""

    objective: str
    """The objective, e.g. "p95<50ms" or "avail>=99.9%"."""
    events: int
    """Requests it is judged over (successes for latency, all for availability)."""
    bad: int
    """Requests that broke it (slower than the threshold, or failed)."""
    allowed_fraction: float
    """The error budget as a fraction of events (1 - quantile, or 1 - availability)."""
    bad_fraction: float
    """bad / events."""
    burn_rate: float
    """bad_fraction / allowed_fraction: 1 spends the budget exactly over the period."""
    consumed: float
    """Share of the period's budget this run spent: burn_rate × wall_s / period_s."""
    exhausted_in_s: float | None
    """At this burn rate the period's budget lasts this long (None when nothing burns)."""
    met: bool
    """bad_fraction <= allowed_fraction."""


def budget(slo: Slo, *, hist: LatencyHistogram, successes: int, failures: int, wall_s: float,
           period_s: float = 30 * 86400.0) -> list[BudgetLine]:
    """Each objective's budget, burn rate and verdict for one measured level."""
    out: list[BudgetLine] = []
    for o in slo.latency:
        n = successes
        bad = n - min(n, hist.count_at_or_below(o.threshold_s)) if n else 0
        out.append(_line(o.label, n, bad, 1.0 - o.quantile, wall_s, period_s))
    if slo.availability is not None:
        n = successes + failures
        out.append(_line(f"avail>={slo.availability * 100:g}%", n, failures,
                         1.0 - slo.availability, wall_s, period_s))
    return out


def _line(label: str, n: int, bad: int, allowed: float, wall_s: float,
          period_s: float) -> BudgetLine:
    frac = bad / n if n else 0.0
    burn = frac / allowed if allowed > 0 else (math.inf if bad else 0.0)
    return BudgetLine(objective=label, events=n, bad=bad, allowed_fraction=allowed,
                      bad_fraction=frac, burn_rate=burn,
                      consumed=burn * wall_s / period_s if math.isfinite(burn) else math.inf,
                      exhausted_in_s=(period_s / burn) if burn > 0 else None,
                      met=frac <= allowed + 1e-12)
