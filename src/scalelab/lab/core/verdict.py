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
from collections.abc import Callable
from dataclasses import dataclass, field

from scalelab.lab.core.fits import fit_scaling
from scalelab.lab.core.limits import Evidence, infer_limits, oversubscription
from scalelab.lab.core.objectives import Check, Objective, check_rows, first_miss, metric_value
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.units import format_bytes


@dataclass(frozen=True, kw_only=True)
class Advice:
    """A stage's intervention and its predicted effect, read off the measured curves."""

    intervention: str = ""
    predicted: str = ""


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

@dataclass(kw_only=True)
class StageVerdict:
    stage: str
    measured: bool
    miss: Check | None
    """The first failing check (lowest multiple), None when every measured level passes."""
    passed_up_to: float | None
    """The highest multiple at which every objective passed (None if none did)."""
    target_multiple: float
    limiting: list[Evidence] = field(default_factory=list)
    intervention: str = ""
    predicted: str = ""
    tightest: str = ""
    """When nothing misses: the objective with the least headroom, with its margin."""
    cost: list[tuple[float, float, str]] = field(default_factory=list)
    """(multiple, cost per unit in USD, unit) per level of the baseline series."""
    checks: list[Check] = field(default_factory=list)
    undecided: list[Check] = field(default_factory=list)
    """Checks neither met nor missed (too few samples, a straddling spread, no sample size)
    at the levels the verdict speaks for: up to the first miss, or all when none misses."""
    not_measured: list[str] = field(default_factory=list)
    """Objectives with no value at some level, each as 'label (at 1×, 2×)' or just 'label'
    when no level measured it."""
    decided: str = ""
    """What was decided, e.g. 'meets p95 ≤ 50 ms, availability ≥ 99.9% up to 10×, decided
    at 95%'; 'meets none of its objectives at any level' style text when nothing was."""
    open_text: str = ""
    """What was not decided, e.g. 'undecided at 10×: availability ≥ 99.9% (1,180 requests;
    99.9% needs ≥ 2,995 without a failure)'; empty when everything was."""
    candidate_checks: list[Check] = field(default_factory=list)
    """The goal's candidate objectives (`StageGoal.candidate_metrics`) on every series but the
    baseline: what an alternative must keep to be recommended."""
    candidates: list[str] = field(default_factory=list)
    """One line per candidate series: what it misses, meets and left undecided."""

    @property
    def outcome(self) -> str:
        """'missed', 'met' (every check at every level met), 'undecided', 'not measured', or
        'no objectives' (measured, nothing to judge)."""
        if not self.measured:
            return "not measured"
        if not self.checks:
            return "no objectives"
        if self.miss is not None:
            return "missed"
        if self.undecided or self.not_measured:
            return "undecided"
        return "met"


@dataclass(kw_only=True)
class Verdict:
    stages: list[StageVerdict]
    first: StageVerdict | None
    summary: str

    @property
    def outcome(self) -> str:
        """'missed' when a stage missed, 'undecided' when any stage has an undecided or
        unmeasured check (or measured nothing), else 'met': what `--fail-on` gates on."""
        outs = {s.outcome for s in self.stages}
        if "missed" in outs:
            return "missed"
        return "met" if outs <= {"met", "no objectives"} else "undecided"


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
    return f"extrapolated {at / last:.3g}× beyond the last measured level"


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
            f": {top.rate:.4g} {unit} measured at {var}={top.level:g}; no fit is extrapolated "
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
            f"throughput falls as {var} grows ({first:.4g} → {last:.4g} {unit} {span}, "
            f"measured): adding {var} makes it slower"
        )
    if fit.chosen == "usl" and fit.usl is not None and levels[0] < fit.usl.n_peak < math.inf:
        return (
            f"the usl fit (chosen by AIC over linear and Amdahl) peaks at "
            f"{var}≈{fit.usl.n_peak:.3g} with {fit.usl.x_peak:.4g} {unit}, "
            f"{extrapolation(fit.usl.n_peak, levels[-1])}"
        )
    chosen = fit.model(fit.chosen)
    alpha = chosen.params.get("alpha", 0.0) if chosen is not None else 0.0
    if fit.chosen in ("usl", "amdahl") and alpha > 0:
        gamma = chosen.params.get("gamma", 0.0) if chosen is not None else 0.0
        return (
            f"the {fit.chosen} fit (chosen by AIC) has a ceiling of {gamma / alpha:.4g} {unit} "
            f"(serial fraction {alpha:.2f}), approached only as {var} grows without bound: "
            f"extrapolated beyond the last measured level ({levels[-1]:g})"
        )
    return (
        f"throughput grows {last / first:.2f}× {span} (measured; the {fit.chosen} fit, chosen "
        "by AIC, supports no ceiling: measure higher levels to find one)"
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


def generic_advice(inp: AdviceInput) -> Advice:
    """Advice for a stage that brings no advisor of its own (e.g. a user's custom stage):
    the action that fits the strongest measured signal, or what to measure next."""
    predicted = curve_prediction(inp.base, cores=inp.cores)
    for ev in inp.limits:
        if ev.resource in _ACTIONS:
            action = f"{ev.resource}: {_ACTIONS[ev.resource]}"
            return Advice(intervention=action, predicted=predicted)
    if any(ev.resource == "none saturated" for ev in inp.limits):
        return Advice(
            intervention=(
                "no measured resource is saturated, so the limit is one not measured here: a "
                "serial section, locks, the network or a downstream service; profile one level "
                "(py-spy dump, perf) or trace a request next"
            ),
            predicted=predicted,
        )
    return Advice(
        intervention=(
            "no resource signal was measured: record CPU time, peak memory and I/O wait of the "
            "stage (scalelab sweep measures its command's process tree) and run it again"
        ),
        predicted=predicted,
    )


def num_text(v: float | None) -> str:
    """A value for a verdict line: four significant digits, or a dash when not measured."""
    return "—" if v is None else f"{v:.4g}"


def count_text(n: int) -> str:
    return f"{n:,}"


def decision_text(c: Check) -> str:
    """A check's value with what it rests on: '0.99 on 1,000 requests, 95% bounds
    0.9831–0.9946'; 'point, 1 repeat'; 'not measured'."""
    d = c.decision
    if d.value is None:
        return "not measured"
    shown = (format_bytes(d.value) if c.objective.metric == "peak_memory_bytes"
             else f"{d.value:.4g}")
    if d.confidence is not None:
        if d.n is None:
            return f"{shown}, sample size not recorded"
        lo, hi = num_text(d.lower), num_text(d.upper)
        return f"{shown} on {count_text(d.n)}, {d.confidence:.0%} bounds {lo}–{hi}"
    if d.basis == "repeats":
        return f"{shown}, {d.n} repeats {num_text(d.lower)}–{num_text(d.upper)}"
    return f"{shown}, point" + (f" ({d.n} repeat{'s' if d.n != 1 else ''})" if d.n else "")


def _decide_reach(v: StageVerdict) -> None:
    """passed_up_to, the undecided and unmeasured checks, and the stage's two lines."""
    levels = sorted({c.multiple for c in v.checks})
    at: dict[float, list[Check]] = {m: [c for c in v.checks if c.multiple == m] for m in levels}
    reach = None
    for m in levels:  # only a contiguous run of fully met levels from the lowest counts
        if not all(c.outcome == "met" for c in at[m]):
            break
        reach = m
    v.passed_up_to = reach
    limit = v.miss.multiple if v.miss is not None else math.inf
    shown = [c for c in v.checks if c.multiple <= limit]
    v.undecided = [c for c in shown if c.outcome == "undecided"]
    gaps: dict[str, list[float]] = {}
    for c in shown:
        if c.outcome == "not measured":
            gaps.setdefault(c.objective.label, []).append(c.multiple)
    measured_at = {m for m in levels if m <= limit}
    v.not_measured = [
        label if set(ms) == measured_at else f"{label} (at {', '.join(f'{m:g}×' for m in ms)})"
        for label, ms in gaps.items()
    ]
    if not v.checks:
        v.decided = "no objectives to judge (measured only)"
    elif reach is not None:
        met = at[reach]
        labels = ", ".join(dict.fromkeys(c.objective.label for c in met))
        groups: dict[str, list[str]] = {}
        for c in met:
            d = c.decision
            how_one = (f"decided at {d.confidence:.0%}" if d.confidence is not None
                       else f"over {d.n} repeats" if d.basis == "repeats"
                       else "as measured points")
            groups.setdefault(how_one, []).append(c.objective.label)
        how = (f", {next(iter(groups))}" if len(groups) == 1 else " (" + "; ".join(
            f"{', '.join(dict.fromkeys(ls))} {h}" for h, ls in groups.items()) + ")")
        v.decided = f"meets {labels} up to {reach:g}×{how}"
    else:
        v.decided = "meets its objectives at no level (none decided met at the lowest)"
    if v.undecided:
        first = min(c.multiple for c in v.undecided)
        parts = [f"{c.objective.label} ({c.decision.need or decision_text(c)})"
                 for c in v.undecided if c.multiple == first]
        more = sorted({c.multiple for c in v.undecided} - {first})
        v.open_text = f"undecided at {first:g}×: " + "; ".join(parts) + (
            f"; also undecided at {', '.join(f'{m:g}×' for m in more)}" if more else "")


def judge_stage(
    goal: StageGoal, sheet: list[SheetRow], *, cores: int, memory_bytes: int
) -> StageVerdict:
    rows_all = [r for r in sheet if r.stage == goal.stage]
    by_series: dict[str, list[SheetRow]] = {}
    for r in rows_all:
        by_series.setdefault(r.series, []).append(r)
    base = by_series.get(goal.baseline_series) or (
        next(iter(by_series.values())) if by_series else []
    )
    v = StageVerdict(
        stage=goal.stage,
        measured=bool(base),
        miss=None,
        passed_up_to=None,
        target_multiple=goal.target_multiple,
    )
    if not base:
        return v
    own = [o for o in goal.objectives if o.metric not in goal.candidate_metrics]
    relative = [o for o in goal.objectives if o.metric in goal.candidate_metrics]
    v.checks = check_rows(base, own)
    v.miss = first_miss(v.checks)
    _decide_reach(v)
    if relative:
        for name, rows in by_series.items():
            if rows is base:
                continue
            cv = StageVerdict(stage=goal.stage, measured=True, miss=None, passed_up_to=None,
                             target_multiple=goal.target_multiple,
                             checks=check_rows(rows, relative))
            cv.miss = first_miss(cv.checks)
            _decide_reach(cv)
            v.candidate_checks += cv.checks
            head = (f"misses {cv.miss.objective.label} at {cv.miss.multiple:g}× "
                    f"({decision_text(cv.miss)})" if cv.miss is not None else cv.decided)
            v.candidates.append(f"{name}: {head}" + (f"; {cv.open_text}" if cv.open_text else ""))
    v.limiting = infer_limits(base, cores=cores, memory_bytes=memory_bytes)
    v.cost = [
        (r.multiple, r.cost_per_unit_usd, r.cost_unit or "unit")
        for r in base
        if r.cost_per_unit_usd is not None
    ]
    advisor = goal.advisor or generic_advice
    advice = advisor(
        AdviceInput(goal=goal, base=base, by_series=by_series, limits=v.limiting, miss=v.miss,
                    cores=cores)
    )
    v.intervention, v.predicted = advice.intervention, advice.predicted
    if v.miss is None:
        margins = [
            (c.objective.margin(c.value), c)
            for c in v.checks
            if c.value is not None and c.outcome == "met"
        ]
        if margins:
            m, c = min(margins, key=lambda t: t[0])
            value = c.value or 0.0
            shown = (
                format_bytes(value)
                if c.objective.metric == "peak_memory_bytes"
                else f"{value:.4g}"
            )
            v.tightest = f"{c.objective.label}: {shown} at {c.multiple:g}× ({m:.0%} headroom)"
    return v


def judge(
    goals: list[StageGoal], sheet: list[SheetRow], *, cores: int, memory_bytes: int
) -> Verdict:
    stages = [judge_stage(g, sheet, cores=cores, memory_bytes=memory_bytes) for g in goals]
    missing = [s for s in stages if s.miss is not None]
    first = min(missing, key=lambda s: s.miss.multiple if s.miss else math.inf, default=None)
    if first is not None and first.miss is not None:
        lim = first.limiting[0] if first.limiting else None
        summary = (
            f"{first.stage} misses first: {first.miss.objective.label} fails at "
            f"{first.miss.multiple:g}× ({first.miss.objective.metric} = "
            f"{decision_text(first.miss)})"
            + (f"; limiting resource: {lim.resource} ({lim.detail})" if lim else "")
            + (f". Do: {first.intervention}" if first.intervention else "")
            + (f". Predicted: {first.predicted}" if first.predicted else "")
        )
    else:
        measured = [s for s in stages if s.measured and s.checks]
        met = [s for s in measured if s.outcome == "met"]
        open_ = [s for s in measured if s.outcome != "met"]
        reach = ", ".join(f"{s.stage} to {num_text(s.passed_up_to)}×" for s in met)
        tight = "; ".join(f"{s.stage}: {s.tightest}" for s in met if s.tightest)
        summary = (
            "no stage misses its objectives at the measured levels"
            + (f"; decided met: {reach}" if reach else "; none decided met at every level")
            + "".join(
                f"; {s.stage} met to {num_text(s.passed_up_to)}×, "
                + (s.open_text or "")
                + (("; " if s.open_text else "") + "not measured: " + ", ".join(s.not_measured)
                   if s.not_measured else "")
                for s in open_
            )
            + "".join(f"; {s.stage} not measured" for s in stages if not s.measured)
            + (f"; least headroom — {tight}" if tight else "")
        )
    return Verdict(stages=stages, first=first, summary=summary)
