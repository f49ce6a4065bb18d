"""Service-level objectives for load results: parse "p95<50ms", error budgets, burn rates.

An SLO here is latency objectives (the q-quantile of successful requests' latency under a
threshold: equivalently at most 1 - q of them slower) plus an optional availability target (at
most an error budget of failed requests). For one measured level, each objective's bad-event
fraction divided by its allowance is the burn rate: 1 spends the budget exactly over the SLO
period, 10 spends a 30-day budget in 3 days.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.objectives import parse_percent, parse_terms, read_term
from scalelab.lab.load.histogram import LatencyHistogram


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


def parse_slo(text: str | None, *, error_budget: str | None = None) -> Slo:
    """Parse "p95<50ms,p99<200ms,avail>=99.9%" (comma-separated; any order; the grammar is
    core/objectives.py's).

    `error_budget` ("0.1%") sets availability = 1 - budget and overrides one in `text`.
    """
    lat, avail = parse_terms(text, _read_term, "\"p95<50ms\", \"p99<=0.2s\", "
                             "\"avail>=99.9%\" or \"errors<0.1%\"")
    if error_budget is not None:
        avail = round(1.0 - parse_percent(error_budget, what="--error-budget"), 12)
    return Slo(latency=tuple(lat), availability=avail)


def _read_term(term: str) -> LatencyObjective | float | None:
    t = read_term(term)
    if t is None or t.of is not None:
        return None
    if t.quantile is None or t.threshold_s is None:
        return t.availability
    return LatencyObjective(quantile=t.quantile, threshold_s=t.threshold_s)


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
