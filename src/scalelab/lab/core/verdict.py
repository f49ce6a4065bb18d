"""The verdict: which stage first misses its objective, at what multiple, why, and what to do.

Inputs are the sheet (core.sheet), each stage's objectives (core.objectives), the machine, the
limits each stage recorded itself and the run's failed stages. `judge` builds the verdict once
as frozen data — decisions, reach against the target, what would decide each undecided check,
curve points, limiting evidence (core.limits), the stage's advice (core.advice), failures — and
every renderer (report.screen, report.verdict_text, report.document) reads it; nothing edits a
rendered string.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scalelab.lab.core.advice import (
    Advice,
    AdviceInput,
    Advisor,
    StageGoal,
    best_capacity,
    capacity,
    curve_prediction,
    extrapolation,
    generic_advice,
    num_text,
)
from scalelab.lab.core.decide import quantile_requests_needed, trials_needed
from scalelab.lab.core.limits import Evidence, infer_limits
from scalelab.lab.core.objectives import Check, check_rows, first_miss, quantile_of
from scalelab.lab.core.sheet import SAMPLES_UNIT_KEY, SheetRow
from scalelab.lab.core.units import format_multiple

__all__ = [  # the advice names stay importable from here, where the stages import them
    "Advice", "AdviceInput", "Advisor", "Candidate", "Gap", "Headroom", "Need", "Reach",
    "StageGoal", "StageVerdict", "UnitCost", "Verdict", "best_capacity", "capacity",
    "curve_prediction", "extrapolation", "generic_advice", "judge", "judge_stage", "num_text",
    "purpose",
]


@dataclass(frozen=True, kw_only=True)
class Gap:
    """An objective with no value at some of the levels the verdict speaks for."""

    label: str
    multiples: tuple[float, ...]
    everywhere: bool
    """True when no level the verdict speaks for measured it."""


@dataclass(frozen=True, kw_only=True)
class Need:
    """What would decide an undecided check: the samples its rule needs at that level and the
    time that pays them at the rate this run measured there (arithmetic on the rows)."""

    check: Check
    samples: int | None
    """Samples the rule needs at the level in all; None when no count follows from the rule
    (a bound straddling the limit, repeats that straddle it): more of them decide it."""
    measured: int | None
    """Samples the level measured."""
    unit: str
    """What a sample is ("requests", "queries", "repeats")."""
    per_second: float | None
    """Samples per second the level measured (its trials over its wall time)."""

    @property
    def seconds(self) -> float | None:
        """Wall time of one level that measures `samples` at `per_second`."""
        if self.samples is None or not self.per_second:
            return None
        return self.samples / self.per_second


@dataclass(frozen=True, kw_only=True)
class Reach:
    """The capacity at the objectives against the target: the highest multiple decided met,
    and the baseline's rate there."""

    multiple: float | None
    target: float
    rate: float | None = None
    rate_unit: str | None = None

    @property
    def holds(self) -> bool:
        return self.multiple is not None and self.multiple >= self.target


@dataclass(frozen=True, kw_only=True)
class Headroom:
    """The met check with the least headroom (margin: 0.2 = 20% inside the bound)."""

    check: Check
    margin: float


@dataclass(frozen=True, kw_only=True)
class UnitCost:
    multiple: float
    usd: float
    unit: str


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """An alternative series judged on the goal's candidate objectives."""

    series: str
    checks: tuple[Check, ...]
    miss: Check | None
    passed_up_to: float | None
    undecided: tuple[Check, ...]


@dataclass(frozen=True, kw_only=True)
class StageVerdict:
    """One stage, decided: built once by `judge_stage`, read by every renderer."""

    stage: str
    measured: bool
    target_multiple: float
    checks: tuple[Check, ...] = ()
    """Every objective at every level of the baseline series."""
    miss: Check | None = None
    """The first failing check (the lowest multiple decided missed), None when none missed."""
    passed_up_to: float | None = None
    """The highest multiple at which every decision was met, from the lowest decided level up
    (a curve point left undecided is skipped, not a break); None when none was."""
    reach: Reach | None = None
    undecided: tuple[Check, ...] = ()
    """Decisions neither met nor missed at the levels the verdict speaks for: up to the first
    miss, or all when none missed (curve points are not decisions: never listed here)."""
    not_measured: tuple[Gap, ...] = ()
    needs: tuple[Need, ...] = ()
    """What would decide each undecided check at the lowest undecided level."""
    curve_multiples: tuple[float, ...] = ()
    """Levels measured as points of the curve (the records' purpose "curve"), not decisions."""
    decided_by: tuple[str, ...] = ()
    """How levels were decided other than by their own load (the capacity search's steps at or
    above the target's rate, with the assumption), one clause a level that says so."""
    limiting: tuple[Evidence, ...] = ()
    """The stage's own recorded limits first, then what the measured signals show."""
    advice: Advice = field(default_factory=Advice)
    tightest: Headroom | None = None
    """When nothing missed: the met check with the least headroom."""
    cost: tuple[UnitCost, ...] = ()
    candidate_checks: tuple[Check, ...] = ()
    candidates: tuple[Candidate, ...] = ()
    failure: str | None = None
    """Why the stage failed (its system did not answer), from the run; None when it did not."""

    @property
    def outcome(self) -> str:
        """'failed', 'missed', 'met' (every decision met), 'undecided', 'not measured', or
        'no objectives' (measured, nothing to judge)."""
        if self.failure is not None:
            return "failed"
        if not self.measured:
            return "not measured"
        if not self.checks:
            return "no objectives"
        if self.miss is not None:
            return "missed"
        if self.undecided or self.not_measured or self.passed_up_to is None:
            # met needs a level decided met: curve points alone that decided nothing (a stage
            # cut to its first step) leave it open
            return "undecided"
        return "met"

    @property
    def intervention(self) -> str:
        return self.advice.intervention

    @property
    def predicted(self) -> str:
        return self.advice.predicted


@dataclass(frozen=True, kw_only=True)
class Verdict:
    stages: tuple[StageVerdict, ...]

    @property
    def first(self) -> StageVerdict | None:
        """The stage that misses at the lowest multiple (ties: the first stage listed)."""
        missed = [s for s in self.stages if s.miss is not None]
        return min(missed, key=lambda s: s.miss.multiple if s.miss else math.inf,
                   default=None)

    @property
    def failed(self) -> dict[str, str]:
        return {s.stage: s.failure for s in self.stages if s.failure is not None}

    @property
    def outcome(self) -> str:
        """'failed' when a stage's system did not answer, else 'missed' when a stage missed,
        'undecided' when any stage has an undecided or unmeasured check (or measured nothing),
        else 'met': what `--fail-on` gates on."""
        outs = {s.outcome for s in self.stages}
        if "failed" in outs:
            return "failed"
        if "missed" in outs:
            return "missed"
        return "met" if outs <= {"met", "no objectives"} else "undecided"

    def stage(self, name: str) -> StageVerdict | None:
        return next((s for s in self.stages if s.stage == name), None)



PLACEHOLDERS = ("not measured", "none saturated")
"""Inferred limits that only say nothing saturated: a stage's own recorded limit replaces them."""

CURVE = "curve"
"""A record's purpose when its level was measured for the picture, not to decide."""


def purpose(row: SheetRow) -> str:
    """The row's purpose: "curve" when its level was measured for the picture only, else
    "decision" (`SheetRow.purpose`, from the records' typed field)."""
    return row.purpose


SAMPLES_RATE_KEY = "samples_per_s"
"""Record extra: samples per second a level's measurement windows delivered (a sized level's,
diagnose.sizing); what a Need's time is read from before the record's wall_s."""


def samples_needed(c: Check, row: SheetRow | None) -> int | None:
    """The samples the check's rule needs at its level, where a count follows from the rule."""
    o, d = c.objective, c.decision
    q = quantile_of(o.metric)
    if q is not None:
        least = quantile_requests_needed(q)
        return least if d.n is not None and d.n < least else None
    if o.metric in ("failure_rate", "availability") and row is not None:
        budget = (1.0 - o.min if o.min is not None else None) if o.metric == "availability" \
            else o.max
        k, n = row.failure_events, row.failure_trials
        if budget is None or not 0.0 < budget < 1.0 or k is None or not n or k / n >= budget:
            return None
        return trials_needed(k, budget)
    return None


def _need(c: Check, row: SheetRow | None) -> Need:
    said = row.extras.get(SAMPLES_UNIT_KEY) if row is not None else None
    unit = said if isinstance(said, str) and said else (
        "repeats" if c.decision.basis == "repeats" else "requests")
    per_second = None
    said_rate = row.extras.get(SAMPLES_RATE_KEY) if row is not None else None
    if isinstance(said_rate, int | float) and said_rate > 0:
        # the rate the level's own measurement windows delivered (diagnose.sizing): a
        # record's wall_s may time something else (a retrieval record's is its index build)
        per_second = float(said_rate)
    elif row is not None and row.failure_trials and row.wall_s and row.repeats:
        per_second = row.failure_trials / row.repeats / row.wall_s
    return Need(check=c, samples=samples_needed(c, row), measured=c.decision.n, unit=unit,
                per_second=per_second)


def _reach(checks: list[Check], curve: set[float]) -> float | None:
    """The highest multiple up to which every decision was met: levels ascend from the
    lowest; a curve point that decided nothing is skipped, any other unmet level stops it."""
    reach = None
    for m in sorted({c.multiple for c in checks}):
        outs = {c.outcome for c in checks if c.multiple == m}
        if outs == {"met"}:
            reach = m
        elif m in curve and "missed" not in outs:
            continue
        else:
            break
    return reach


def _gaps(shown: list[Check], levels: set[float]) -> tuple[Gap, ...]:
    gaps: dict[str, list[float]] = {}
    for c in shown:
        if c.outcome == "not measured":
            gaps.setdefault(c.objective.label, []).append(c.multiple)
    return tuple(Gap(label=label, multiples=tuple(ms), everywhere=set(ms) == levels)
                 for label, ms in gaps.items())


@dataclass(frozen=True, kw_only=True)
class _Decided:
    miss: Check | None
    passed_up_to: float | None
    undecided: tuple[Check, ...]
    not_measured: tuple[Gap, ...]
    needs: tuple[Need, ...]
    curve_multiples: tuple[float, ...]


def _decisions(checks: list[Check], rows: list[SheetRow], target: float) -> _Decided:
    """What a series' checks decide: the first miss, the reach, the undecided and unmeasured
    checks (curve points only count where they decided), and what would decide the rest: at
    the target multiple when it is undecided there, else at the lowest undecided level."""
    curve = {r.multiple for r in rows if purpose(r) == CURVE}
    decided = [c for c in checks if c.multiple not in curve or c.outcome in ("met", "missed")]
    miss = first_miss(decided)
    limit = miss.multiple if miss is not None else math.inf
    shown = [c for c in decided if c.multiple <= limit]
    undecided = tuple(c for c in shown if c.outcome == "undecided")
    by_level = {r.multiple: r for r in rows}
    at = {c.multiple for c in undecided}
    lowest = target if target in at else min(at, default=None)
    return _Decided(
        miss=miss, passed_up_to=_reach(checks, curve), undecided=undecided,
        not_measured=_gaps(shown, {c.multiple for c in shown}),
        needs=tuple(_need(c, by_level.get(c.multiple)) for c in undecided
                    if c.multiple == lowest),
        curve_multiples=tuple(sorted(curve)))


def _candidates(goal: StageGoal, by_series: dict[str, list[SheetRow]],
                base: list[SheetRow]) -> tuple[Candidate, ...]:
    relative = [o for o in goal.objectives if o.metric in goal.candidate_metrics]
    if not relative:
        return ()
    out = []
    for name, rows in by_series.items():
        if rows is base:
            continue
        checks = check_rows(rows, relative)
        d = _decisions(checks, rows, goal.target_multiple)
        out.append(Candidate(series=name, checks=tuple(checks), miss=d.miss,
                             passed_up_to=d.passed_up_to, undecided=d.undecided))
    return tuple(out)


def _tightest(checks: list[Check]) -> Headroom | None:
    margins = [(c.objective.margin(c.value), c) for c in checks
               if c.value is not None and c.outcome == "met"]
    if not margins:
        return None
    m, c = min(margins, key=lambda t: t[0])
    return Headroom(check=c, margin=m)


def judge_stage(
    goal: StageGoal, sheet: list[SheetRow], *, cores: int, memory_bytes: int,
    own_limits: Sequence[Evidence] = (), failure: str | None = None,
) -> StageVerdict:
    """One stage decided from its rows, once: `own_limits` are the limits the stage itself
    recorded (they lead the inferred ones), `failure` why its system did not answer."""
    by_series: dict[str, list[SheetRow]] = {}
    for r in sheet:
        if r.stage == goal.stage:
            by_series.setdefault(r.series, []).append(r)
    base = by_series.get(goal.baseline_series) or next(iter(by_series.values()), [])
    if not base:
        return StageVerdict(stage=goal.stage, measured=False,
                            target_multiple=goal.target_multiple, failure=failure)
    own = [o for o in goal.objectives if o.metric not in goal.candidate_metrics]
    checks = check_rows(base, own)
    d = _decisions(checks, base, goal.target_multiple)
    inferred = infer_limits(base, cores=cores, memory_bytes=memory_bytes)
    limiting = [*own_limits, *(e for e in inferred
                               if not own_limits or e.resource not in PLACEHOLDERS)]
    advisor = goal.advisor or generic_advice
    advice = advisor(AdviceInput(goal=goal, base=base, by_series=by_series, limits=limiting,
                                 miss=d.miss, cores=cores))
    at = {r.multiple: r for r in base}.get(d.passed_up_to or math.nan)
    candidates = _candidates(goal, by_series, base)
    return StageVerdict(
        stage=goal.stage, measured=True, target_multiple=goal.target_multiple,
        checks=tuple(checks), miss=d.miss, passed_up_to=d.passed_up_to,
        undecided=d.undecided, not_measured=d.not_measured, needs=d.needs,
        curve_multiples=d.curve_multiples,
        decided_by=tuple(dict.fromkeys(f"at {format_multiple(r.multiple)}: {r.decided_by}"
                                       for r in base if r.decided_by)),
        reach=Reach(multiple=d.passed_up_to, target=goal.target_multiple,
                    rate=at.rate if at else None, rate_unit=at.rate_unit if at else None),
        limiting=tuple(limiting), advice=advice,
        tightest=_tightest(checks) if d.miss is None else None,
        cost=tuple(UnitCost(multiple=r.multiple, usd=r.cost_per_unit_usd,
                            unit=r.cost_unit or "unit")
                   for r in base if r.cost_per_unit_usd is not None),
        candidate_checks=tuple(c for cand in candidates for c in cand.checks),
        candidates=candidates, failure=failure,
    )


def judge(
    goals: list[StageGoal], sheet: list[SheetRow], *, cores: int, memory_bytes: int,
    stage_limits: Mapping[str, Sequence[Evidence]] | None = None,
    failures: Mapping[str, str] | None = None,
) -> Verdict:
    """The verdict, built once from the sheet with each stage's own recorded limits and the
    run's failed stages already in it (a failed stage the goals do not name is added)."""
    limits, failed = stage_limits or {}, failures or {}
    stages = [judge_stage(g, sheet, cores=cores, memory_bytes=memory_bytes,
                          own_limits=limits.get(g.stage, ()), failure=failed.get(g.stage))
              for g in goals]
    named = {g.stage for g in goals}
    stages += [StageVerdict(stage=s, measured=False, target_multiple=math.nan, failure=why)
               for s, why in failed.items() if s not in named]
    return Verdict(stages=tuple(stages))

