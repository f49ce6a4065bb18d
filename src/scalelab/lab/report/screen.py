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

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.units import format_multiple, format_number
from scalelab.lab.core.verdict import StageVerdict, Verdict
from scalelab.lab.report.verdict_text import count_text, need_text, target_text

WIDTH = 80
"""Columns of plain output: a terminal's default, and what CI logs show without wrapping."""

COLUMNS = ("stage", "verdict", "capacity / target", "limit", "do")

_UNITS = {"requests": "req", "predictions": "pred", "queries": "q"}


@dataclass(frozen=True, kw_only=True)
class ScreenLine:
    """One stage's cells and the lines that follow the table for it."""

    stage: str
    verdict: str
    outcome: str
    capacity: str
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
    u = unit or ""
    for long, short in _UNITS.items():
        u = u.replace(long, short)
    return format_number(rate, u)


def capacity_cell(s: StageVerdict) -> str:
    """'5× / 10× (1.2k req/s)': the highest multiple decided met against the target, with
    the rate measured there; '— / 10×' when no level was decided met."""
    if not s.measured:
        return ""
    reach = s.reach
    rate = rate_text(reach.rate, reach.rate_unit) if reach is not None else ""
    return (f"{format_multiple(s.passed_up_to)} / {target_text(s)}"
            + (f" ({rate})" if rate else ""))


def limit_cell(e: Evidence | None) -> str:
    """The resource with its leading number: 'cpu 1.99 of 2 cores busy'."""
    if e is None:
        return "not measured"
    detail = e.detail
    for sep in (" at ", " (", ": ", "; ", " in ", ", "):
        detail = detail.split(sep, 1)[0]
    has_number = any(ch.isdigit() for ch in detail)
    return f"{e.resource} {detail}" if has_number and len(detail) <= 24 else e.resource


def screen_line(s: StageVerdict) -> ScreenLine:
    notes: list[str] = []
    if s.failure is not None:
        notes.append(f"{s.stage} failed: {s.failure}")
    if s.outcome == "undecided" and s.needs:
        needs = "; ".join(f"{n.check.objective.label} at {format_multiple(n.check.multiple)} "
                          f"needs {need_text(n)}" for n in s.needs)
        notes.append(f"{s.stage}: {needs}")
    elif s.outcome == "undecided" and s.not_measured:
        notes.append(f"{s.stage}: not measured: "
                     + ", ".join(g.label for g in s.not_measured))
    return ScreenLine(
        stage=s.stage, verdict=verdict_cell(s), outcome=s.outcome, capacity=capacity_cell(s),
        limit=limit_cell(s.limiting[0] if s.limiting else None) if s.measured else "",
        action=s.advice.headline if s.measured else "", notes=tuple(notes))


def header(v: Verdict) -> str:
    """'scalelab verdict: 7 stages; 1 misses, 1 undecided, 5 hold'."""
    counts: dict[str, int] = {}
    for s in v.stages:
        counts[s.outcome] = counts.get(s.outcome, 0) + 1
    words = {"failed": "failed", "missed": "missed", "undecided": "undecided",
             "met": "met", "not measured": "not measured", "no objectives": "no objectives"}
    said = ", ".join(f"{counts[k]} {w}" for k, w in words.items() if k in counts)
    first = v.first
    lead = (f"; {first.stage} misses first, at {format_multiple(first.miss.multiple)}"
            if first is not None and first.miss is not None else "")
    return f"scalelab verdict: {count_text(len(v.stages))} stages: {said}{lead}"


def _table(rows: Sequence[Sequence[str]], width: int) -> list[str] | None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if sum(widths) + 2 * (len(widths) - 1) > width:
        return None
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def plain_lines(v: Verdict, report: Path | str, *, width: int = WIDTH) -> list[str]:
    """The first screen as plain aligned text, no line longer than `width`: the action moves
    to a 'do' line under the table (wrapped here) only when a row would not fit."""
    lines = [screen_line(s) for s in v.stages]
    full = [COLUMNS, *((ln.stage, ln.verdict, ln.capacity, ln.limit, ln.action)
                       for ln in lines)]
    table = _table(full, width)
    moved: list[str] = []
    if table is None:
        table = _table([r[:4] for r in full], width) or _table(
            [(r[0], r[1], r[2]) for r in full], width) or [" ".join(r[:2]) for r in full]
        moved = [f"do ({ln.stage}): {ln.action}" for ln in lines if ln.action]
    out = [header(v), *table]
    for note in [*moved, *(n for ln in lines for n in ln.notes)]:
        out += textwrap.wrap(note, width=width, subsequent_indent="  ",
                             break_on_hyphens=False)
    out += textwrap.wrap(f"report: {report} (the sheet and the long verdict: report.md, "
                         f"or scalelab report DIR --verbose)", width=width,
                         subsequent_indent="  ", break_long_words=False)
    return out


_STYLE = {"missed": "bold red", "failed": "bold red", "met": "green", "undecided": "yellow"}


def print_screen(c: Console, v: Verdict, report: Path | str) -> None:
    """The first screen: plain aligned lines outside a terminal, a rich table on one."""
    if not c.is_terminal:
        for line in plain_lines(v, report, width=WIDTH):
            c.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    lines = [screen_line(s) for s in v.stages]
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
    c.print(f"report: {report} (the sheet and the long verdict: report.md, or scalelab "
            "report DIR --verbose)", markup=False, highlight=False)
