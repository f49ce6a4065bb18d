"""A diagnosis's time budget (`diagnose --budget 4m30s`): how it is split across the stages.

Every enabled stage first gets its minimum: what its fixed work takes (start-up, the steps it
always runs, one chunk of each level) by the stage's own estimate on a 2-core machine. What is
left goes to the stages whose levels are sized sequentially (a level runs in chunks until its
objectives are decided or its share is spent, see diagnose.sizing), in proportion to their
minimums: a stage with more levels gets more of the spare time. A budget under the sum of the
minimums is bad usage: it names the minimum and what makes it up.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.records import Record

SIZING_KEY = "sizing"
"""Record extra: how a sized level was sized (diagnose.sizing.Sizing.as_dict)."""

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s|ms)?", re.IGNORECASE)
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3}


def parse_budget(text: str, *, what: str = "--budget") -> float:
    """'5m' -> 300.0, '4m30s' -> 270.0, '90' -> 90.0 seconds (a bare number is seconds)."""
    s = str(text).strip().replace(" ", "")
    pos, total, units = 0, 0.0, []
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None or m.end() == pos:
            break
        unit = (m.group(2) or "s").lower()
        units.append(unit)
        total += float(m.group(1)) * _UNIT_S[unit]
        pos = m.end()
    if not s or pos != len(s) or len(set(units)) != len(units):
        raise BadUsageError(f"{what}: {text!r} is not a duration; write e.g. 5m, 4m30s or 300s")
    if total <= 0:
        raise BadUsageError(f"{what}: {text!r} must be longer than 0 s, e.g. 5m")
    return total


def duration_text(seconds: float) -> str:
    """270.0 -> '4m30s', 45.5 -> '45.5s' (the form parse_budget reads back)."""
    m, s = divmod(round(seconds, 1), 60.0)
    if m >= 1:
        return f"{int(m)}m{s:g}s" if s else f"{int(m)}m"
    return f"{s:g}s"


def budget_text(seconds: float) -> str:
    """A --budget rounded up to 10 s, as --budget reads it back: 312.4 -> '5m20s'."""
    return duration_text(math.ceil(seconds / 10.0) * 10.0)


def budget_paying(total_s: float, more_s: float, part: float) -> float:
    """The --budget that gives a stage `more_s` more seconds (pure): its `part` of any extra
    second (a sized stage's minimum over the sized stages' minimums, `split_budget`; 1 for a
    fixed stage or a shared input, which take the seconds first)."""
    return total_s + more_s / part if part > 0 else total_s + more_s


@dataclass(frozen=True, kw_only=True)
class StageNeed:
    """What one enabled stage needs of the budget."""

    stage: str
    minimum_s: float
    """Its fixed work's estimated seconds (start-up, steps it always runs, one chunk a level)."""
    sized: bool
    """Whether its levels are sized sequentially, i.e. can turn more time into decisions."""
    least_s: float | None = None
    """The least its decision needs, when it can cut its fixed work (a fixed stage's curve
    points and candidates, see `plan_parts`); None: its minimum."""

    @property
    def floor_s(self) -> float:
        return self.minimum_s if self.least_s is None else min(self.least_s, self.minimum_s)


@dataclass(frozen=True, kw_only=True)
class Share:
    """One stage's part of the budget."""

    stage: str
    minimum_s: float
    """Its estimated minimum (StageNeed.minimum_s)."""
    share_s: float
    """The seconds it may take: the minimum, plus its part of the remainder when sized."""
    sized: bool
    least_s: float | None = None
    """Its least (StageNeed.least_s)."""


def split_budget(total_s: float, needs: list[StageNeed]) -> list[Share]:
    """Each stage its minimum; the remainder to the sized stages in proportion to their
    minimums (unused when no stage is sized). Under the sum of the minimums, each stage gets
    its least (`StageNeed.least_s`) and the same fraction of what its minimum adds to it.
    Bad usage when `total_s` is under the sum of the leasts."""
    least = sum(n.floor_s for n in needs)
    if total_s < least:
        parts = ", ".join(f"{n.stage} {duration_text(n.floor_s)}" for n in needs)
        raise BadUsageError(
            f"--budget {duration_text(total_s)} is under the {duration_text(least)} the enabled "
            f"stages need at least ({parts}); raise --budget, disable stages, or use --quick")
    whole = sum(n.minimum_s for n in needs)
    if total_s < whole:
        f = (total_s - least) / (whole - least)
        return [Share(stage=n.stage, minimum_s=n.minimum_s, sized=n.sized, least_s=n.least_s,
                      share_s=n.floor_s + f * (n.minimum_s - n.floor_s)) for n in needs]
    spare = total_s - whole
    weight = sum(n.minimum_s for n in needs if n.sized)
    return [
        Share(stage=n.stage, minimum_s=n.minimum_s, sized=n.sized, least_s=n.least_s,
              share_s=n.minimum_s + (spare * n.minimum_s / weight if n.sized and weight else 0.0))
        for n in needs
    ]


def pace(done: list[tuple[float, float]]) -> float:
    """How much slower than planned the machine delivered so far (pure): the stages run so
    far's seconds spent over their seconds planned (`(planned_s, spent_s)` each: a fixed
    stage's minimum, a sized stage's share as it started), never under 1 (a fast start leaves
    its spare time to the sized stages anyway, it does not shrink the later minimums)."""
    planned = sum(p for p, _ in done)
    spent = sum(s for _, s in done)
    return max(1.0, spent / planned) if planned > 0 else 1.0


def least_at(need: StageNeed, slow: float) -> float:
    """The seconds a stage still to run is sure of when not every minimum fits (pure): its
    least (`StageNeed.floor_s`) at the pace `slow`; a fixed stage's over `PLAN_FILL` when the
    pace is over 1 (never over its minimum at the pace), since that is the part of its share
    it plans to fill (`Plan.quiet_s`): at its bare least its one step has no room for an
    estimate off by a few percent, and the last stage's deadline is the budget's end (the
    online stage given 20.2 s for its 20.3 s least at pace 1.42 was stopped at 20.3 s and
    measured nothing, 2026-12-07, load 2.5 falling to 1.2)."""
    if need.sized or slow <= 1.0:
        return need.floor_s * slow
    return min(need.minimum_s, need.floor_s / PLAN_FILL) * slow


def replan(left_s: float, now: StageNeed, later: list[StageNeed], *, slow: float = 1.0) -> float:
    """The share of the stage starting now, re-planned from what is left of the budget (pure).

    Each stage still to run (this one and `later`) needs its minimum times `slow` (the pace
    the machine delivered so far, `pace`). When what is left pays for every need, this stage
    gets its need plus, when sized, its part of the rest in proportion to its minimum, as
    `split_budget` gave it. When it does not but pays for every stage's least (`least_at`: a
    fixed stage with its curve points and candidates cut, with room for its estimate to
    miss), each gets its least and the same fraction of what its minimum adds to it. When not
    even the leasts fit, a fixed stage gets its least while what is left pays for it (less
    measures nothing: its one step is stopped at its deadline), and a sized stage (whose first
    chunks measure something) shares what is left over the later fixed stages' leasts with
    the other sized stages in proportion to their leasts: an earlier overrun is paid by the
    stages that can cut their work, not by the last fixed stage (the online stage, left
    0.1 s under its least by the retrieval stage's proportional share, measured nothing)."""
    left = max(0.0, left_s)
    todo = [now, *later]
    needs = [n.minimum_s * slow for n in todo]
    total = sum(needs)
    if total <= 0:
        return left if now.sized else 0.0
    if left > total:
        weight = sum(n.minimum_s for n in todo if n.sized)
        spare = left - total
        return needs[0] + (spare * now.minimum_s / weight if now.sized and weight else 0.0)
    leasts = [least_at(n, slow) for n in todo]
    least = sum(leasts)
    if left >= least:
        f = (left - least) / (total - least) if total > least else 1.0
        return leasts[0] + f * (needs[0] - leasts[0])
    if not now.sized:
        return min(left, leasts[0])
    fixed_later = sum(x for n, x in zip(later, leasts[1:], strict=True) if not n.sized)
    sized = sum(x for n, x in zip(todo, leasts, strict=True) if n.sized)
    return max(0.0, left - fixed_later) * leasts[0] / sized if sized > 0 else 0.0


def stage_deadline(now: float, share_s: float, end: float, later_least_s: float, *,
                   sized: bool, slack: float) -> float:
    """When a stage's running step is stopped (pure): `slack` times its share, never past the
    point where the stages after it could no longer get their leasts (`later_least_s`, at this
    run's pace, before `end`, the budget's end less the report's time), and never past `end`.

    A fixed stage may run past `slack` times its share up to that point: its share is a quiet
    estimate times a pace, which can miss by 2x (the train stage at 1 and 4 workers, planned
    at 16 s at pace 1.13, took 24 s, was stopped and measured nothing, 2026-12-07, load 2.5),
    and what it overruns the sized stages after it give up from their spare time. A sized stage
    cuts its own work to its share and stops at `slack` times it, or earlier where the later
    stages' leasts start (its overrun left the last stage, online, nothing in that run)."""
    protect = end - later_least_s
    soft = now + share_s * slack
    at = min(soft, max(now + share_s, protect)) if sized else max(soft, protect)
    return max(now, min(at, end))


PLAN_FILL = 0.85
"""The part of its share a fixed stage plans to fill on a machine slower than its estimates
(pace > 1): at load 13–15 on the shared VM (2026-12-07) the train stage planned at 81 s of
its 81 s share at pace 4.95 took longer and was stopped at its deadline, measuring nothing."""


@dataclass(frozen=True, kw_only=True)
class Part:
    """One piece of a fixed stage's work (a level, a policy, a variant) and what it costs."""

    name: str
    """How the report names it, e.g. '5×' or 'policy weekly'."""
    cost_s: float
    """Its seconds on a quiet 2-core machine (the stage's measured estimate)."""
    needed: bool = False
    """Whether the stage's decision needs it (its target, the base its multiple is read
    against): such a part always runs; the others are curve points or candidates."""
    role: str = "curve point"
    """What it is when not needed: 'curve point', 'candidate series', ..."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a fixed stage runs of its work in its share (`plan_parts`), and what it cut."""

    kept: tuple[Part, ...]
    dropped: tuple[Part, ...]
    fixed_s: float
    """Quiet seconds the stage pays whatever it runs (process start-up, inputs)."""
    share_s: float | None
    slow: float

    @property
    def quiet_s(self) -> float:
        """The quiet seconds its share pays for at the pace: the share over the pace, a part
        of it (`PLAN_FILL`) when the pace is over 1; no budget: unbounded."""
        if self.share_s is None:
            return math.inf
        return self.share_s * (1.0 if self.slow <= 1.0 else PLAN_FILL) / max(self.slow, 1e-9)

    @property
    def cost_s(self) -> float:
        """Quiet seconds of what it runs, fixed work included."""
        return self.fixed_s + sum(p.cost_s for p in self.kept)

    def note(self, stage: str) -> str | None:
        """Why the dropped parts were not measured, with the numbers (None: nothing cut)."""
        if not self.dropped or self.share_s is None:
            return None
        names = ", ".join(p.name for p in self.dropped)
        roles = sorted({p.role for p in self.dropped})
        more = sum(p.cost_s for p in self.dropped) * self.slow
        return (f"{stage}: {names} ({' and '.join(roles)}) not measured: its "
                f"{self.share_s:.3g} s share at this run's pace ({self.slow:.3g}× the quiet "
                f"estimates) pays for {', '.join(p.name for p in self.kept) or 'nothing'} "
                f"(~{self.cost_s * self.slow:.3g} s); the rest needed ~{more:.3g} s more")


@dataclass(frozen=True, kw_only=True)
class Work:
    """A fixed stage's default work as parts, each with its quiet cost (`Part`)."""

    fixed_s: float
    """Quiet seconds it pays whatever it runs (process start-up, reading its inputs)."""
    parts: tuple[Part, ...]

    @property
    def whole_s(self) -> float:
        """All of it: the stage's minimum (what a budget gives it before the sized stages)."""
        return self.fixed_s + sum(p.cost_s for p in self.parts)

    @property
    def least_s(self) -> float:
        """What its decision needs: the fixed work and the needed parts."""
        return self.fixed_s + sum(p.cost_s for p in self.parts if p.needed)


def plan_parts(work: Work, *, share_s: float | None, slow: float = 1.0) -> Plan:
    """A fixed stage's work cut to its share (pure): every needed part, then the others in
    the order given while their quiet cost times `slow` (the pace the machine delivered so
    far, `pace`) still fits; a part that does not fit is skipped, a cheaper later one may
    still run. No share (no budget): everything."""
    if share_s is None:
        return Plan(kept=work.parts, dropped=(), fixed_s=work.fixed_s, share_s=None, slow=slow)
    # A pace over 1 is measured on other work than this: plan to a part of the share, so an
    # estimate off by that much does not stop the stage's one step unfinished at its deadline.
    room = Plan(kept=(), dropped=(), fixed_s=0.0, share_s=share_s, slow=slow).quiet_s \
        - work.least_s
    kept, dropped = [], []
    for p in work.parts:
        if p.needed:
            kept.append(p)
        elif p.cost_s <= room:
            kept.append(p)
            room -= p.cost_s
        else:
            dropped.append(p)
    return Plan(kept=tuple(kept), dropped=tuple(dropped), fixed_s=work.fixed_s,
                share_s=share_s, slow=slow)


def time_lines(budget: dict[str, Any] | None, records: list[Record]) -> list[str]:
    """The report's "Time" section: how each stage spent its time (against its share under a
    budget) and each sized level its chunks, and what stayed undecided when time ran out."""
    out: list[str] = []
    if budget:
        total = budget.get("total_s")
        head = (f"budget {duration_text(float(total))}: each stage its minimum, the sized "
                "stages the rest" if isinstance(total, int | float) else
                "no budget: " + ("--full, each sized level until decided or its cap"
                                 if budget.get("full") else "one chunk a level"))
        start = budget.get("startup_s")
        spent = [f"start-up {start:.3g} s"] if isinstance(start, int | float) else []
        for row in budget.get("stages", []):
            s = f"{row['stage']} {row['spent_s']:.0f} s"
            if "given_s" in row:
                s += f" of a {row['given_s']:.0f} s share"
            elif "share_s" in row:
                s += f" (minimum {row['share_s']:.0f} s)"
            if isinstance(row.get("pace"), int | float) and row["pace"] > 1.0:
                s += f" (pace {row['pace']:.3g}×)"
            spent.append(s)
        out.append(f"{head}; spent: {', '.join(spent)}" if spent else head)
        if any(isinstance(row.get("pace"), int | float) and row["pace"] > 1.0
               for row in budget.get("stages", [])):
            out.append("pace: how much slower than their quiet 2-core estimates the start-up "
                       "and the steps before a stage ran (each share is cut by it)")
    for r in records:
        z = r.extras.get(SIZING_KEY)
        if not isinstance(z, dict):
            continue
        series = r.series
        where = f"{r.stage}{f' {series}' if series else ''} at {r.level:g}"
        if r.repeat:
            where += f" #{r.repeat + 1}"
        n = z.get("samples")
        line = (f"{where}: {z['chunks']} chunk(s), {n if n is None else f'{n:,}'} samples in "
                f"{z['spent_s']:.1f} s of a {z['share_s']:.1f} s share, {z['stopped']}")
        if z.get("undecided"):
            why = " for lack of time" if z["stopped"] == "time share spent" else ""
            line += f"; undecided{why}: " + "; ".join(z["undecided"])
        out.append(line)
    return out
