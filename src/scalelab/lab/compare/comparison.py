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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from scalelab.lab.compare.batches import (
    ShareSpread,
    least_latencies,
    share_bounds,
    share_spread,
)
from scalelab.lab.compare.calibration import Pooled, Spread
from scalelab.lab.compare.intervals import (
    Interval,
    Latencies,
    fisher_p,
    holm,
    p_different,
    p_equivalent,
)
from scalelab.lab.compare.sides import RUNS_AS_UNITS, Evidence, Key, evidence, group
from scalelab.lab.core.decide import quantile_requests_needed
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.records import Record

NO_SPREAD = "order statistic, no slices"
"""A quantile's basis when neither side kept slices enough to see its noise between runs."""

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
        out = []
        if any(r.basis.startswith("between runs: pooled t, run spread") for r in self.rows):
            out.append("intervals over runs count the spread between runs measured in the "
                       "calibration records (--noise): valid where their runs had A's and "
                       "B's duration and rate, on the same machine")
        if any(r.unit == "latencies" for r in self.rows):
            out.append("quantiles of one run a side: their intervals hold the noise within "
                       "each run (its sampling and its drift between slices), not a change "
                       "of the machine's state between runs that stays the same all through "
                       "a run; give --noise the records of repeated runs of one setup, or "
                       f"run 2+ ({RUNS_AS_UNITS}+ to decide more) repeats a side, to count "
                       "that too")
        return out

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
    invalid: str = ""
    """Why a side's run at this level decides nothing (the load tester judged it invalid)."""
    iv: Callable[[float], Interval] | None = None
    """The interval at any α (what the p-values invert)."""


def _invalid(a: list[Record], b: list[Record]) -> str:
    """A run its own tool judged invalid (a generator that fell behind measured its own
    lateness, not the server) decides nothing: the first such reason, or ""."""
    for side, recs in (("A", a), ("B", b)):
        bad = next((r for r in recs if not r.ok), None)
        if bad is not None:
            return (f"{side}'s run is invalid ({bad.error or 'ok: false'}); rerun it where it "
                    "is valid")
    return ""


def _calibrated(t: _Test, cal: Spread, *, alpha: float, margin: float) -> _Test:
    """`t` with the spread between runs counted: over 3+ repeats a side the pooled t
    replaces Welch's (the same sides' spread, more degrees of freedom); with fewer, the
    interval is the wider of the within-run one and the pooled t over runs (which holds the
    noise within runs of the calibration's size, not of smaller ones)."""
    runs = t.ev.runs
    assert runs is not None
    pooled = Pooled(a=runs.a, b=runs.b, cal=cal)
    within = t.interval is not None and t.unit == "latencies"
    basis = (f"between runs: pooled t, run spread {pooled.sd * 100:.3g}% ({pooled.df} df, "
             f"{cal.runs} calibration runs)" if cal.runs else
             f"between runs: pooled t over the sides' runs, run spread {pooled.sd * 100:.3g}% "
             f"({pooled.df} df)")

    def iv(x: float) -> Interval:
        lo, hi = pooled.ratio(x)
        if within:
            assert t.iv is not None
            wlo, whi = t.iv(x)
            lo, hi = min(lo, wlo), max(hi, whi)
        return lo, hi

    return replace(t, ratio=t.ratio if within else pooled.point(), interval=iv(alpha),
                   n_a=len(runs.a), n_b=len(runs.b), unit="runs",
                   basis=basis + (", or within runs, the wider" if within else ""),
                   p_diff=p_different(iv, margin), p_equiv=p_equivalent(iv, margin))


def _test(key: Key, ev: Evidence, *, alpha: float, margin: float,
          noise: dict[str, Spread]) -> _Test:
    t = _test_within(key, ev, alpha=alpha, margin=margin)
    runs = ev.runs
    if runs is None or min(runs.a + runs.b) <= 0:
        return t
    cal = noise.get(ev.metric)
    if cal is None:
        # Two runs a side merged: their own spread between runs (2 df) counts as well, as
        # batches over the concatenated slices would count it with too many df.
        if t.unit != "latencies" or min(len(runs.a), len(runs.b)) < 2:
            return t
        cal = Spread(ss=0.0, df=0, runs=0)
    return _calibrated(t, cal, alpha=alpha, margin=margin)


def _test_within(key: Key, ev: Evidence, *, alpha: float, margin: float) -> _Test:
    if ev.failures is not None:
        ka, na, kb, nb = ev.failures
        return _Test(key, ev, ka / na if na else None, kb / nb if nb else None, None, None,
                     na, nb, "requests", "fisher exact", fisher_p(ka, na, kb, nb), None)
    if ev.q is not None and ev.a_lat is not None and ev.b_lat is not None:
        return _quantile_test(key, ev, ev.a_lat, ev.b_lat, ev.q, alpha=alpha, margin=margin)
    reps = ev.repeats
    assert reps is not None
    ga = math.exp(sum(map(math.log, reps.a)) / len(reps.a)) if min(reps.a) > 0 else None
    gb = math.exp(sum(map(math.log, reps.b)) / len(reps.b)) if min(reps.b) > 0 else None
    if not reps.usable:
        return _Test(key, ev, ga, gb, None if not (ga and gb) else gb / ga, None, len(reps.a),
                     len(reps.b), "repeats", "repeats (welch t)", None, None)
    return _Test(key, ev, ga, gb, reps.point(), reps.ratio(alpha), len(reps.a), len(reps.b),
                 "repeats", "repeats (welch t)", p_different(reps.ratio, margin),
                 p_equivalent(reps.ratio, margin), iv=reps.ratio)


def _quantile_test(key: Key, ev: Evidence, la: Latencies, lb: Latencies, q: float, *,
                   alpha: float, margin: float) -> _Test:
    """One run (or two) a side: each side's order-statistic interval widened to its
    batch-means one (batches.py), whichever is wider at each α, so both the sampling noise
    and the noise correlated in time count. Without slices to estimate the latter:
    undecided."""
    a, b = la.quantile(q), lb.quantile(q)
    ratio = b / a if a > 0 else None
    sa = share_spread(la.slices, q, a) if la.slices else None
    sb = share_spread(lb.slices, q, b) if lb.slices else None
    if sa is None or sb is None or ratio is None:
        return _Test(key, ev, a, b, ratio, None, la.n, lb.n, "latencies", NO_SPREAD,
                     None, None)

    def side(lat: Latencies, s: ShareSpread, level: float) -> Interval:
        lo1, hi1 = lat.bounds(q, level)
        lo2, hi2 = share_bounds(lat.values_ms, lat.counts, q, level, s)
        return min(lo1, lo2), max(hi1, hi2)

    def iv(x: float) -> Interval:
        # Each side at 1 − α/2, so both hold together with ≥ 1 − α (as quantile_ratio).
        a_lo, a_hi = side(la, sa, 1.0 - x / 2.0)
        b_lo, b_hi = side(lb, sb, 1.0 - x / 2.0)
        return (b_lo / a_hi if a_hi > 0 else 0.0), (b_hi / a_lo if a_lo > 0 else math.inf)

    basis = (f"batch means ({sa.batches} and {sb.batches} batches) or order statistic, "
             "the wider")
    return _Test(key, ev, a, b, ratio, iv(alpha), la.n, lb.n, "latencies", basis,
                 p_different(iv, margin), p_equivalent(iv, margin), iv=iv)


def _need(t: _Test, margin: float, confidence: float) -> str:
    sides = f"{t.n_a:,} and {t.n_b:,} {t.unit}"
    if t.invalid:
        return t.invalid
    if t.basis == NO_SPREAD:
        q = t.ev.q or 0.5
        return (f"{sides}, no estimate of the noise between runs: {least_latencies(q):,} a "
                f"side in records with slices (scalelab load, load llm), or "
                f"{RUNS_AS_UNITS}+ repeats a side")
    if t.p_diff is None:
        if t.unit == "repeats":
            return f"{sides}: ≥ 2 repeats a side decide it"
        return f"{sides}: no difference shown"
    iv, ratio = t.interval, t.ratio
    if iv is None or ratio is None or ratio <= 0:
        return f"{sides}: no difference shown"
    if iv[0] <= 0 or math.isinf(iv[1]):
        q = t.ev.q or 0.5
        if t.unit == "runs":  # the within-run interval it is widened to is unbounded
            return (f"{sides}: one run's own p{q * 100:g} is unbounded (too few latencies "
                    "or batches): longer runs")
        # Each side's bound is one-sided at 1 − α/4 (two tails, two sides).
        least = quantile_requests_needed(q, 1.0 - (1.0 - confidence) / 4.0)
        if min(t.n_a, t.n_b) < least:
            return f"{sides}: p{q * 100:g} is bounded from ≥ {least:,} a side"
        # Enough latencies, too few batches: their spread leaves the quantile unbounded.
        return (f"{sides}: too few batches bound p{q * 100:g}: longer runs, or "
                f"{RUNS_AS_UNITS}+ repeats a side")
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
            confidence: float = 0.95, noise: dict[str, Spread] | None = None) -> Comparison:
    """B's records against A's (see the module doc for the decisions); `noise`: each
    metric's spread between runs of one unchanged setup (calibration.spreads), counted in
    every interval of that metric."""
    if not 0.0 < margin < 1.0:
        raise BadUsageError(f"--margin {margin:g} must lie in (0, 1), e.g. 5%")
    if not 0.5 < confidence < 1.0:
        raise BadUsageError(f"--confidence {confidence:g} must lie in (0.5, 1), e.g. 95%")
    alpha = 1.0 - confidence
    ga, gb = group(a), group(b)
    tests = []
    for k in sorted(set(ga) & set(gb)):
        bad = _invalid(ga[k], gb[k])
        for ev in evidence(ga[k], gb[k]):
            t = _test(k, ev, alpha=alpha, margin=margin, noise=noise or {})
            tests.append(replace(t, p_diff=None, p_equiv=None, invalid=bad) if bad else t)
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
