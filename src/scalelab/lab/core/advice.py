"""Advice: what a stage's advisor sees and returns, and the advice every stage shares.

A stage's intervention comes from its own advisor (`StageGoal.advisor`, supplied by whoever
defines the stage: core names no part) or, without one, from the strongest measured signal
(`generic_advice`); its predicted effect is read off the measured curves (`curve_prediction`)
— never invented: where no curve supports a number, the text says what to measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from scalelab.lab.core.fits import fit_scaling
from scalelab.lab.core.limits import Evidence, oversubscription
from scalelab.lab.core.objectives import Check, Objective, metric_value
from scalelab.lab.core.sheet import SheetRow
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
