"""The first screen: one line a stage, then where the report is.

Each stage's line says whether it holds to its target ("holds to 10×"), where it first misses
("first misses at 2×": the lowest level decided missed) or that it is undecided; the capacity
at its objectives against the target; the limiting resource with its number; the one action.
What would decide an undecided stage (samples, and the time that pays them at this run's
measured rate) and why a stage failed follow in a line each. The long verdict and the sheet
are in report.md/report.html and `scalelab report DIR --verbose`.

Plain text (a pipe, a CI log) is laid out here to `width` columns, nothing wrapped or cut by
the terminal; on a terminal the same cells go into a rich table.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.units import format_duration, format_multiple, format_number
from scalelab.lab.core.verdict import PLACEHOLDERS, Need, StageVerdict, Verdict
from scalelab.lab.report.verdict_text import count_text, target_text

WIDTH = 80
"""Columns of plain output: a terminal's default, and what CI logs show without wrapping."""

COLUMNS = ("stage", "verdict", "cap/target", "limit", "do")

_UNITS = {"requests": "req", "predictions": "pred", "queries": "q"}


@dataclass(frozen=True, kw_only=True)
class ScreenLine:
    """One stage's cells and the lines that follow the table for it."""

    stage: str
    verdict: str
    outcome: str
    capacity: str
    capacity_short: str
    """The capacity without its rate, for a narrow screen."""
    limit: str
    action: str
    notes: tuple[str, ...]


def verdict_cell(s: StageVerdict) -> str:
    if s.failure is not None:
        return "failed"
    if s.outcome == "missed" and s.miss is not None:
        return f"first misses at {format_multiple(s.miss.multiple)}"
    if s.outcome == "met" and s.reach is not None and s.reach.holds:
        return f"holds to {format_multiple(s.passed_up_to)}"
    if s.outcome == "met":
        return f"holds to {format_multiple(s.passed_up_to)} (below target)"
    return {"undecided": "undecided", "not measured": "not measured",
            "no objectives": "no objectives"}[s.outcome]


def rate_text(rate: float | None, unit: str | None) -> str:
    """A rate with its unit shortened for a column: 1234 requests/s -> '1.23k req/s'."""
    if rate is None:
        return ""
    u = (unit or "").split(" ")[0]  # 'events/s ingested' -> 'events/s'

    for long, short in _UNITS.items():
        u = u.replace(long, short)
    return format_number(rate, u)


def capacity_cell(s: StageVerdict, *, rate: bool = True) -> str:
    """'5× / 10× (1.2k req/s)': the highest multiple decided met against the target, with
    the rate measured there; '— / 10×' when no level was decided met."""
    if not s.measured:
        return ""
    reach = s.reach
    shown = rate_text(reach.rate, reach.rate_unit) if reach is not None and rate else ""
    return (f"{format_multiple(s.passed_up_to)} / {target_text(s)}"
            + (f" ({shown})" if shown else ""))


_NUMBER = re.compile(r"[×x]?\d[\d.,]*(?:%| ?[KMGT]iB|×)?(?: of \d+ cores)?")


def limit_cell(e: Evidence | None) -> str:
    """The resource with its telling number: 'cpu 1.94 of 2 cores', 'communication 51%',
    'cores ×2'; the resource alone when its evidence has no number."""
    if e is None:
        return "not measured"
    found = _NUMBER.findall(e.detail)
    marked = [f for f in found if f.endswith(("%", "B", "cores")) or f.startswith("×")]
    pick = (marked or found or [""])[0].replace(" of ", "/")
    return f"{e.resource} {pick}".strip() if e.resource not in PLACEHOLDERS else e.resource


def short_need(n: Need) -> str:
    """'2,995 requests: 30.6 s at 98 req/s'; 'more than 3,000 requests'."""
    if n.samples is None:
        return ("a recorded sample size" if n.measured is None
                else f"more than {count_text(n.measured)} {n.unit}")
    pays = (f": {format_duration(n.seconds)} at {rate_text(n.per_second, n.unit + '/s')}"
            if n.seconds is not None else "")
    return f"{count_text(n.samples)} {n.unit}{pays}"


@dataclass(frozen=True, kw_only=True)
class RunBudget:
    """The run's --budget and how its spare time is split: each sized stage gets the part of
    any extra second in proportion to its minimum (`diagnose.budget.split_budget`)."""

    total_s: float
    part: dict[str, float]
    """Sized stage -> its minimum over all the sized stages' minimums."""
    unpaid: dict[str, str] = field(default_factory=dict)
    """Stage -> why it started nothing (`unpaid_note`): its start, or a shared input's, needed
    more than its deadline left at this run's pace (run.json's `unpaid`)."""

    def deciding(self, stage: str, more_s: float) -> float | None:
        """The --budget whose split gives `stage` `more_s` more seconds (pure); None for a
        stage the budget does not size."""
        part = self.part.get(stage)
        return self.total_s + more_s / part if part else None


def need_note(stage: str, needs: tuple[Need, ...], *, budget: RunBudget | None = None) -> str:
    """One line a stage: what decides its open checks, named by the check that needs the most
    samples (one with no count first): they are sized at one level, so it pays for the
    others; with the run's `budget`, the --budget that would pay it."""
    most = max(needs, key=lambda n: math.inf if n.samples is None else n.samples)
    at = format_multiple(most.check.multiple)
    others = len(needs) - 1
    also = f" (and {count_text(others)} other check{'s' if others > 1 else ''})" if others else ""
    line = f"{stage}: {most.check.objective.label} at {at}{also} needs {short_need(most)}"
    more = more_seconds(most)
    total = budget.deciding(stage, more) if budget is not None and more is not None else None
    if total is not None:
        line += f"; about --budget {_minutes(total)} would pay it"
    return line


def _minutes(seconds: float) -> str:
    """A --budget rounded up to 10 s: 312.4 -> '5m20s' (what --budget reads back)."""
    t = math.ceil(seconds / 10.0) * 10
    m, sec = divmod(t, 60)
    return f"{m}m{sec}s" if m and sec else (f"{m}m" if m else f"{sec}s")


def more_seconds(n: Need) -> float | None:
    """Seconds beyond what the level measured that its samples need at its rate (pure)."""
    if n.samples is None or not n.per_second:
        return None
    return max(0.0, n.samples - (n.measured or 0)) / n.per_second


def budget_of(report: Path | str) -> RunBudget | None:
    """The run's --budget and split, from its run.json beside the report (None: no budget,
    or no such file: a report rebuilt elsewhere)."""
    path = Path(report).parent / "run.json"
    try:
        doc = json.loads(path.read_text("utf-8"))
        b = doc["budget"]
        total = float(b["total_s"])
        sized = {r["stage"]: float(r["minimum_s"]) for r in b["stages"] if r.get("sized")}
    except (OSError, ValueError, TypeError, KeyError):
        return None
    weight = sum(sized.values())
    unpaid = doc.get("unpaid")
    return RunBudget(total_s=total, part={k: v / weight for k, v in sized.items()}
                     if weight > 0 else {},
                     unpaid={str(k): unpaid_note(str(k), v) for k, v in unpaid.items()
                             if isinstance(v, dict)} if isinstance(unpaid, dict) else {})


def unpaid_note(stage: str, d: dict[str, object]) -> str:
    """'llm: not measured: needs ~52.5 s, had 20 s; about --budget 6m30s would pay it' (a
    shared input's: 'input features needs ...'): seconds at this run's pace (pure)."""
    need, left, total = d.get("need_s"), d.get("left_s"), d.get("budget_s")
    stopped = d.get("stopped_s")
    if isinstance(stopped, int | float):  # a shared input stopped at its deadline
        return (f"{stage}: not measured: input {d.get('input')} stopped at its deadline "
                f"after {format_duration(float(stopped))}")
    what = f"input {d['input']} needs" if d.get("input") else "needs"
    line = f"{stage}: not measured: {what} ~{format_duration(float(need))}" \
        if isinstance(need, int | float) else f"{stage}: not measured"
    if isinstance(left, int | float):
        line += f", had {format_duration(float(left))}" if left > 0 else ", had none left"
    if isinstance(total, int | float):
        line += f"; about --budget {_minutes(float(total))} would pay it"
    return line


def screen_line(s: StageVerdict, *, budget: RunBudget | None = None) -> ScreenLine:
    notes: list[str] = []
    if s.failure is not None:
        notes.append(f"{s.stage} failed: {s.failure}")
    if s.outcome == "undecided" and s.needs:
        notes.append(need_note(s.stage, s.needs, budget=budget))
    elif s.outcome == "not measured" and budget is not None and s.stage in budget.unpaid:
        notes.append(budget.unpaid[s.stage])
    elif s.outcome == "undecided" and s.not_measured:
        notes.append(f"{s.stage}: not measured: "
                     + ", ".join(g.label for g in s.not_measured))
    return ScreenLine(
        stage=s.stage, verdict=verdict_cell(s), outcome=s.outcome, capacity=capacity_cell(s),
        capacity_short=capacity_cell(s, rate=False),
        limit=limit_cell(s.limiting[0] if s.limiting else None) if s.measured else "",
        action=s.advice.headline if s.measured else "", notes=tuple(notes))


def header(v: Verdict) -> str:
    """'scalelab: 7 stages · 1 missed, 2 undecided, 4 met · train first misses at 2×'."""
    counts: dict[str, int] = {}
    for s in v.stages:
        counts[s.outcome] = counts.get(s.outcome, 0) + 1
    order = ("failed", "missed", "undecided", "met", "not measured", "no objectives")
    said = ", ".join(f"{counts[k]} {k}" for k in order if k in counts)
    first = v.first
    lead = (f" · {first.stage} first misses at {format_multiple(first.miss.multiple)}"
            if first is not None and first.miss is not None else "")
    return f"scalelab: {count_text(len(v.stages))} stages · {said}{lead}"


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]


MIN_ACTION = 12
"""The narrowest 'do' column worth keeping; a longer action moves under the table."""


def _layout(lines: list[ScreenLine], width: int) -> tuple[list[tuple[str, ...]], list[str]]:
    """The table's rows (header first) and the actions moved under it: the rate leaves the
    capacity before any action moves; an action too long for its row moves under the table,
    except a stage's that holds its target (its action is in the report)."""
    cells: list[tuple[str, ...]] = []
    room = 0
    for with_rate in (True, False):
        cells = [(ln.stage, ln.verdict, ln.capacity if with_rate else ln.capacity_short,
                  ln.limit) for ln in lines]
        room = width - sum(_widths([COLUMNS[:4], *cells])) - 2 * len(COLUMNS[:4])
        if room >= max(MIN_ACTION, min((len(ln.action) for ln in lines), default=0)):
            break
    fits = room >= MIN_ACTION
    table: list[tuple[str, ...]] = [(*COLUMNS[:4], "do" if fits else "")]
    moved: list[str] = []
    for row, ln in zip(cells, lines, strict=True):
        if fits and len(ln.action) <= room:
            table.append((*row, ln.action))
            continue
        table.append((*row, "(in report)" if fits and ln.outcome == "met" else ""))
        if ln.action and ln.outcome != "met":
            moved.append(f"do ({ln.stage}): {ln.action}")
    return table, moved


def plain_lines(v: Verdict, report: Path | str, *, width: int = WIDTH,
                budget: RunBudget | None = None) -> list[str]:
    """The first screen as plain aligned text, no line longer than `width` (an action too
    long for its row, and every note, is wrapped here under the table)."""
    lines = [screen_line(s, budget=budget) for s in v.stages]
    table, moved = _layout(lines, width)
    widths = _widths(table)
    out = [*textwrap.wrap(header(v), width=width, subsequent_indent="  "),
           *("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in table)]
    for note in [*moved, *(n for ln in lines for n in ln.notes)]:
        out += textwrap.wrap(note, width=width, subsequent_indent="  ",
                             break_on_hyphens=False)
    out += textwrap.wrap(report_line(report), width=width, subsequent_indent="  ",
                         break_long_words=False, break_on_hyphens=False)
    return out


def report_line(report: Path | str) -> str:
    """Where the report is, and how to see the sheet and the long verdict here."""
    return (f"report: {report} · sheet and long verdict: scalelab report "
            f"{Path(report).parent} --verbose")


_STYLE = {"missed": "bold red", "failed": "bold red", "met": "green", "undecided": "yellow"}


def print_screen(c: Console, v: Verdict, report: Path | str) -> None:
    """The first screen: plain aligned lines outside a terminal, a rich table on one."""
    budget = budget_of(report)
    if not c.is_terminal:
        for line in plain_lines(v, report, width=WIDTH, budget=budget):
            c.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    lines = [screen_line(s, budget=budget) for s in v.stages]
    t = Table(title=Text(header(v), style="bold"), title_justify="left", box=None,
              pad_edge=False)
    for col in COLUMNS:
        t.add_column(col, no_wrap=col in ("stage", "verdict"))
    for ln in lines:
        style = _STYLE.get(ln.outcome, "")
        t.add_row(Text(ln.stage), Text(ln.verdict, style=style), Text(ln.capacity),
                  Text(ln.limit), Text(ln.action))
    c.print(t)
    for ln in lines:
        for note in ln.notes:
            c.print(note, markup=False, highlight=False)
    c.print(report_line(report), markup=False, highlight=False)
