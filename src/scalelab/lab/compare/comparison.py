"""B against A, per stage, level and metric: a ratio, its interval, and a decision.

The decision, at family-wise confidence `confidence` over every comparison made (Holm):

* **equivalent**: the ratio is shown within [1 − margin, 1 + margin] (two one-sided tests),
  even where a smaller difference is shown — the margin is the difference that matters;
* **better** / **worse**: the ratio is shown outside [1 − margin, 1 + margin], in the metric's
  good or bad direction (latency and failures: lower is better; rates: higher); a failure
  rate, which may be 0, by Fisher's exact test with no margin;
* **undecided**: neither; `need` says what was measured and what would decide it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from scalelab.lab.compare.intervals import (
    Interval,
    fisher_p,
    holm,
    p_different,
    p_equivalent,
    quantile_ratio,
)
from scalelab.lab.compare.sides import Evidence, Key, evidence, group
from scalelab.lab.core.decide import quantile_requests_needed
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.records import Record

Decision = Literal["better", "worse", "equivalent", "undecided"]
DECISIONS: tuple[Decision, ...] = ("worse", "better", "equivalent", "undecided")


@dataclass(frozen=True, kw_only=True)
class Row:
    """One metric at one level: B against A."""

    stage: str
    series: str
    variable: str
    level: float
    metric: str
    lower_is_better: bool
    a: float | None
    """A's value (a quantile in ms, a geometric mean over repeats, or a failure rate)."""
    b: float | None
    ratio: float | None
    """B / A (None for failure rates that may be 0)."""
    lower: float | None
    """The ratio's two-sided interval at `confidence`, uncorrected (0 or None: no bound)."""
    upper: float | None
    n_a: int
    n_b: int
    unit: str
    """What n counts: latencies, repeats or requests."""
    basis: str
    p_different: float | None
    p_equivalent: float | None
    decision: Decision
    need: str = ""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Every row, and the keys only one side measured."""

    rows: list[Row]
    margin: float
    confidence: float
    comparisons: int
    """How many tests the Holm correction covers (rows with a p-value)."""
    only_a: list[Key] = field(default_factory=list)
    only_b: list[Key] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        """What the decisions do not cover."""
        if any(r.basis.startswith("order statistic") and r.unit == "latencies"
               for r in self.rows):
            return ["quantiles of fewer than 3 repeats a side: their intervals hold the sampling "
                    "noise within a run, not the drift between runs (a busy machine's); run 3+ "
                    "repeats a side to count it"]
        return []

    def counts(self) -> dict[str, int]:
        return {d: sum(r.decision == d for r in self.rows) for d in DECISIONS}

    def to_json(self) -> dict[str, Any]:
        return {"margin": self.margin, "confidence": self.confidence, "correction": "holm",
                "comparisons": self.comparisons, "counts": self.counts(),
                "notes": self.notes,
                "rows": [asdict(r) for r in self.rows],
                "only_a": [list(k) for k in self.only_a],
                "only_b": [list(k) for k in self.only_b]}


@dataclass(frozen=True)
class _Test:
    key: Key
    ev: Evidence
    a: float | None
    b: float | None
    ratio: float | None
    interval: Interval | None
    n_a: int
    n_b: int
    unit: str
    basis: str
    p_diff: float | None
    p_equiv: float | None


def _test(key: Key, ev: Evidence, *, alpha: float, margin: float) -> _Test:
    if ev.failures is not None:
        ka, na, kb, nb = ev.failures
        return _Test(key, ev, ka / na if na else None, kb / nb if nb else None, None, None,
                     na, nb, "requests", "fisher exact", fisher_p(ka, na, kb, nb), None)
    if ev.q is not None and ev.a_lat is not None and ev.b_lat is not None:
        la, lb, q = ev.a_lat, ev.b_lat, ev.q

        def iv(x: float) -> Interval:
            return quantile_ratio(la, lb, q, x)

        a, b = la.quantile(q), lb.quantile(q)
        # One run a side: the interval holds the sampling noise within a run, not the drift
        # between runs (3+ repeats a side compare per-repeat quantiles instead, sides.py).
        basis = "order statistic" + (" (recorded quantiles)" if la.recorded else "")
        return _Test(key, ev, a, b, b / a if a > 0 else None, iv(alpha), la.n, lb.n,
                     "latencies", basis, p_different(iv, margin), p_equivalent(iv, margin))
    reps = ev.repeats
    assert reps is not None
    ga = math.exp(sum(map(math.log, reps.a)) / len(reps.a)) if min(reps.a) > 0 else None
    gb = math.exp(sum(map(math.log, reps.b)) / len(reps.b)) if min(reps.b) > 0 else None
    if not reps.usable:
        return _Test(key, ev, ga, gb, None if not (ga and gb) else gb / ga, None, len(reps.a),
                     len(reps.b), "repeats", "repeats (welch t)", None, None)
    return _Test(key, ev, ga, gb, reps.point(), reps.ratio(alpha), len(reps.a), len(reps.b),
                 "repeats", "repeats (welch t)", p_different(reps.ratio, margin),
                 p_equivalent(reps.ratio, margin))


def _need(t: _Test, margin: float, confidence: float) -> str:
    sides = f"{t.n_a:,} and {t.n_b:,} {t.unit}"
    if t.p_diff is None:
        if t.unit == "repeats":
            return f"{sides}: ≥ 2 repeats a side decide it"
        return f"{sides}: no difference shown"
    iv, ratio = t.interval, t.ratio
    if iv is None or ratio is None or ratio <= 0:
        return f"{sides}: no difference shown"
    if iv[0] <= 0 or math.isinf(iv[1]):
        q = t.ev.q or 0.5
        # Each side's bound is one-sided at 1 − α/4 (two tails, two sides).
        least = quantile_requests_needed(q, 1.0 - (1.0 - confidence) / 4.0)
        return f"{sides}: p{q * 100:g} is bounded from ≥ {least:,} a side"
    half = max(math.log(ratio) - math.log(iv[0]), math.log(iv[1]) - math.log(ratio))
    # Shown outside the margin, or inside it: whichever is nearer, on the log scale.
    dist = abs(abs(math.log(ratio)) - math.log1p(margin))
    n = max(t.n_a, t.n_b)
    more = math.ceil(n * (half / dist) ** 2) if dist > 0 else None
    if more is None or more <= n:
        return f"{sides}: more {t.unit} decide it"
    # Extrapolated: the interval narrows as 1/√n.
    return f"{sides}; ≈{more:,} a side would decide it"


def _or_one(p: float | None) -> float:
    return 1.0 if p is None else p


def compare(a: list[Record], b: list[Record], *, margin: float = 0.05,
            confidence: float = 0.95) -> Comparison:
    """B's records against A's (see the module doc for the decisions)."""
    if not 0.0 < margin < 1.0:
        raise BadUsageError(f"--margin {margin:g} must lie in (0, 1), e.g. 5%")
    if not 0.5 < confidence < 1.0:
        raise BadUsageError(f"--confidence {confidence:g} must lie in (0.5, 1), e.g. 95%")
    alpha = 1.0 - confidence
    ga, gb = group(a), group(b)
    tests = [_test(k, ev, alpha=alpha, margin=margin)
             for k in sorted(set(ga) & set(gb)) for ev in evidence(ga[k], gb[k])]
    tested = [i for i, t in enumerate(tests) if t.p_diff is not None]
    diff = holm([_or_one(tests[i].p_diff) for i in tested], alpha)
    equiv = holm([_or_one(tests[i].p_equiv) for i in tested], alpha)
    shown = {i: (d, e) for i, d, e in zip(tested, diff, equiv, strict=True)}
    rows = []
    for i, t in enumerate(tests):
        d, e = shown.get(i, (False, False))
        if e:
            decision: Decision = "equivalent"
        elif d:
            up = (t.b or 0.0) > (t.a or 0.0) if t.ratio is None else t.ratio > 1.0
            decision = "worse" if up == t.ev.lower_is_better else "better"
        else:
            decision = "undecided"
        stage, series, variable, level = t.key
        rows.append(Row(
            stage=stage, series=series, variable=variable, level=level, metric=t.ev.metric,
            lower_is_better=t.ev.lower_is_better, a=t.a, b=t.b, ratio=t.ratio,
            lower=None if t.interval is None else t.interval[0],
            upper=None if t.interval is None or math.isinf(t.interval[1]) else t.interval[1],
            n_a=t.n_a, n_b=t.n_b, unit=t.unit, basis=t.basis, p_different=t.p_diff,
            p_equivalent=t.p_equiv, decision=decision,
            need=_need(t, margin, confidence) if decision == "undecided" else ""))
    return Comparison(rows=rows, margin=margin, confidence=confidence,
                      comparisons=len(tested), only_a=sorted(set(ga) - set(gb)),
                      only_b=sorted(set(gb) - set(ga)))
