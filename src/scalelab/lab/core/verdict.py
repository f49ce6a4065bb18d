"""The verdict: which stage first misses its objective, at what multiple, why, and what to do.

Inputs are the sheet (core.sheet), each stage's objectives (core.objectives) and the machine.
The limiting resource is inferred from measured signals, each conclusion citing its number:
CPU busy cores against the cores available, memory headroom, queue growth (offered load above
what was served while latency climbs), communication share of step time, the Karp–Flatt serial
fraction, spill, and whatever the stage itself reported. The intervention comes from the
stage's own advisor (`StageGoal.advisor`, supplied by whoever defines the stage: core names no
part) or, without one, from the strongest measured signal; its predicted effect is read off the
measured curves — never invented: where no curve supports a number, the text says what to
measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scalelab.lab.core.decide import quantile_requests_needed, trials_needed
from scalelab.lab.core.fits import fit_scaling
from scalelab.lab.core.limits import Evidence, infer_limits, oversubscription
from scalelab.lab.core.objectives import (
    Check,
    Objective,
    check_rows,
    first_miss,
    metric_value,
    quantile_of,
)
from scalelab.lab.core.sheet import SAMPLES_UNIT_KEY, SheetRow
from scalelab.lab.core.units import format_multiple, format_number


@dataclass(frozen=True, kw_only=True)
class Advice:
    """A stage's intervention and its predicted effect, read off the measured curves."""

    intervention: str = ""
    predicted: str = ""
    action: str = ""
    """The intervention in a few words for the first screen (e.g. 'add replicas'); empty:
    the intervention's first clause stands for it."""

    @property
    def headline(self) -> str:
        """The one action for the first screen: `action`, else the intervention's first
        clause (up to its first colon, semicolon or parenthesis)."""
        if self.action:
            return self.action
        text = self.intervention
        for sep in (":", ";", " (", " —", ","):
            text = text.split(sep, 1)[0]
        return text.strip()


@dataclass(frozen=True, kw_only=True)
class StageGoal:
    """What one stage must keep: its objectives, the series that is today's system, the target."""

    stage: str
    objectives: list[Objective]
    baseline_series: str = ""
    """The series measured as configured today (e.g. 'batching=off'); others are alternatives."""
    target_multiple: float = 10.0
    """The load (or resource) multiple the stage must reach, e.g. 10× today's volume."""
    advisor: Advisor | None = None
    """The stage's own advice (supplied by whoever defines the stage); None: `generic_advice`."""
    candidate_metrics: frozenset[str] = frozenset()
    """Metrics that compare a series with the baseline (recall@10 against exact search, an F1
    delta against fp32, memory against the raw vectors): constant on the baseline by
    construction, so their objectives are judged on every other series, never on the
    baseline against itself."""


@dataclass(frozen=True, kw_only=True)
class AdviceInput:
    """What an advisor sees: the stage's goal, its rows and what the verdict inferred."""

    goal: StageGoal
    base: list[SheetRow]
    """The baseline series' rows (today's system)."""
    by_series: dict[str, list[SheetRow]]
    limits: list[Evidence]
    miss: Check | None
    cores: int = 0
    """The machine's cores (0: not known): a resource sweep past them only oversubscribes."""


Advisor = Callable[[AdviceInput], Advice]

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
    limiting: tuple[Evidence, ...] = ()
    """The stage's own recorded limits first, then what the measured signals show."""
    advice: Advice = Advice()
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
        if self.undecided or self.not_measured:
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



def capacity(rows: list[SheetRow], objectives: list[Objective]) -> float | None:
    """Highest level at which every objective passed, scanning up from the lowest."""
    cap = None
    for row in sorted(rows, key=lambda r: r.level):
        oks = [o.passes(metric_value(row, o.metric, rows)) for o in objectives]
        if any(ok is False for ok in oks):
            break
        cap = row.level
    return cap


def best_capacity(
    inp: AdviceInput, skip_suffix: str = ""
) -> tuple[float, float | None, str | None, float | None]:
    """What an advisor starts from: (the target level: the baseline's lowest level times the
    goal's multiple, the baseline's capacity, the series with the highest capacity and that
    capacity), each capacity the highest level where every objective passed; series whose name
    ends with `skip_suffix` (e.g. capacity searches, not levels) are left out."""
    goal = inp.goal
    target = min((r.level for r in inp.base), default=0.0) * goal.target_multiple
    caps = {s: capacity(rs, goal.objectives) for s, rs in inp.by_series.items()
            if not (skip_suffix and s.endswith(skip_suffix))}
    best_s, best_cap = max(((s, c) for s, c in caps.items() if c is not None),
                           key=lambda t: t[1], default=(None, None))
    return target, caps.get(goal.baseline_series), best_s, best_cap


def extrapolation(at: float, last: float) -> str:
    """How far a predicted level lies beyond the measured ones, said plainly."""
    if at <= last:
        return "within the measured range"
    return f"extrapolated {format_multiple(at / last)} beyond the last measured level"


def curve_prediction(rows: list[SheetRow], *, cores: int = 0) -> str:
    """What the measured rate curve of one series supports saying about growing its variable.

    Only the model AIC chose is read (a USL peak on a straight line is not offered), and a
    level beyond the measured ones says by how much it is extrapolated. A resource sweep
    (workers, processes, threads) is fitted only on levels within the machine's `cores`:
    past them the levels share cores, and no fit is extrapolated through that ceiling."""
    ceiling = oversubscription(rows, cores)
    if ceiling is not None:
        head = f"the ceiling is the machine's {cores} cores ({ceiling.detail.split(' (')[0]})"
        within = [r for r in rows if r.level <= cores and r.rate]
        if not within:
            return head + ": no level within the cores measured a rate"
        top = max(within, key=lambda r: r.level)
        var, unit = rows[0].variable, rows[0].rate_unit or "units/s"
        return head + (
            f": {format_number(top.rate, unit)} measured at {var}={top.level:g}; no fit is "
            "extrapolated "
            f"past the cores, where more {var} only take turns: add cores or machines to grow")
    pts = [(r.level, r.rate) for r in rows if r.rate]
    if len({n for n, _ in pts}) < 2:
        return ""
    var, unit = rows[0].variable, rows[0].rate_unit or "units/s"
    levels = sorted({n for n, _ in pts})
    fit = fit_scaling([n for n, _ in pts], [float(x) for _, x in pts if x is not None])
    first, last = fit.throughput[0], fit.throughput[-1]
    span = f"from {levels[0]:g} to {levels[-1]:g}"
    if last < first:
        return (
            f"throughput falls as {var} grows ({format_number(first)} → "
            f"{format_number(last, unit)} {span}, "
            f"measured): adding {var} makes it slower"
        )
    if fit.chosen == "usl" and fit.usl is not None and levels[0] < fit.usl.n_peak < math.inf:
        return (
            f"the usl fit (chosen by AIC over linear and Amdahl) peaks at "
            f"{var}≈{format_number(fit.usl.n_peak)} with {format_number(fit.usl.x_peak, unit)}, "
            f"{extrapolation(fit.usl.n_peak, levels[-1])}"
        )
    chosen = fit.model(fit.chosen)
    alpha = chosen.params.get("alpha", 0.0) if chosen is not None else 0.0
    if fit.chosen in ("usl", "amdahl") and alpha > 0:
        gamma = chosen.params.get("gamma", 0.0) if chosen is not None else 0.0
        return (
            f"the {fit.chosen} fit (chosen by AIC) has a ceiling of "
            f"{format_number(gamma / alpha, unit)} "
            f"(serial fraction {alpha:.2f}), approached only as {var} grows without bound: "
            f"extrapolated beyond the last measured level ({levels[-1]:g})"
        )
    return (
        f"throughput grows {format_multiple(last / first)} {span} (measured; the {fit.chosen} "
        "fit, chosen by AIC, supports no ceiling: measure higher levels to find one)"
    )


_ACTIONS = {
    "cpu": "add cores or machines, or cut the CPU spent per unit of work",
    "memory": "cut peak memory (stream or partition the input) or move to a larger machine",
    "queue": "add capacity (replicas or batching) or shed load before the queue grows",
    "communication": "communicate less per unit of work (larger batches, fewer exchanges)",
    "cores": "run no more workers, threads or processes than cores (or add cores): beyond them "
    "they only take turns",
    "serial fraction": "shorten the serial phase: more workers only add overhead",
    "disk spill": "give the stage more memory or smaller partitions so it stops spilling",
    "i/o": "move the data closer or to faster storage; prefetch while computing",
}


_SHORT = {
    "cpu": "add cores or cut CPU per unit",
    "memory": "cut peak memory",
    "queue": "add replicas or batching",
    "communication": "communicate less",
    "cores": "no more workers than cores",
    "serial fraction": "shorten the serial phase",
    "disk spill": "more memory per partition",
    "i/o": "faster storage, prefetch",
}


def generic_advice(inp: AdviceInput) -> Advice:
    """Advice for a stage that brings no advisor of its own (e.g. a user's custom stage):
    the action that fits the strongest measured signal, or what to measure next."""
    predicted = curve_prediction(inp.base, cores=inp.cores)
    for ev in inp.limits:
        if ev.resource in _ACTIONS:
            action = f"{ev.resource}: {_ACTIONS[ev.resource]}"
            return Advice(intervention=action, predicted=predicted,
                          action=_SHORT[ev.resource])
    if any(ev.resource == "none saturated" for ev in inp.limits):
        return Advice(
            intervention=(
                "no measured resource is saturated, so the limit is one not measured here: a "
                "serial section, locks, the network or a downstream service; profile one level "
                "(py-spy dump, perf) or trace a request next"
            ),
            predicted=predicted,
            action="profile one level",
        )
    return Advice(
        action="record CPU, memory and I/O",
        intervention=(
            "no resource signal was measured: record CPU time, peak memory and I/O wait of the "
            "stage (scalelab sweep measures its command's process tree) and run it again"
        ),
        predicted=predicted,
    )


def num_text(v: float | None) -> str:
    """A value for a verdict line: 3 significant digits (k/M past a thousand), or a dash."""
    return format_number(v)


PLACEHOLDERS = ("not measured", "none saturated")
"""Inferred limits that only say nothing saturated: a stage's own recorded limit replaces them."""

CURVE = "curve"
"""A record's purpose when its level was measured for the picture, not to decide."""


def purpose(row: SheetRow) -> str | None:
    """The row's purpose ("decision" or "curve") when its records said one; None otherwise."""
    said = getattr(row, "purpose", None) or row.extras.get("purpose")
    return said if isinstance(said, str) and said else None


def _samples_needed(c: Check, row: SheetRow | None) -> int | None:
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
    if row is not None and row.failure_trials and row.wall_s and row.repeats:
        per_second = row.failure_trials / row.repeats / row.wall_s
    return Need(check=c, samples=_samples_needed(c, row), measured=c.decision.n, unit=unit,
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

