"""The verdict in words: the long form (report.md, report.html, `scalelab report --verbose`).

Every line is rendered from the frozen `core.verdict.Verdict` and nothing edits it afterwards;
numbers go through `core.units` (3 significant digits with units).
"""

from __future__ import annotations

import math

from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.objectives import Check
from scalelab.lab.core.units import (
    format_duration,
    format_metric,
    format_multiple,
    format_number,
    format_percent,
    format_usd,
)
from scalelab.lab.core.verdict import Gap, Need, StageVerdict, Verdict


def count_text(n: int) -> str:
    """A count of samples, exact: 2,995."""
    return f"{n:,}"


def decision_text(c: Check) -> str:
    """A check's value with what it rests on: '99% on 1,000 requests, 95% bounds
    98.3%–99.5%'; '41.2 ms, point'; 'not measured'."""
    d, metric = c.decision, c.objective.metric
    if d.value is None:
        return "not measured"
    shown = format_metric(metric, d.value)
    lo, hi = format_metric(metric, d.lower), format_metric(metric, d.upper)
    if d.confidence is not None:
        if d.n is None:
            return f"{shown}, sample size not recorded"
        return f"{shown} on {count_text(d.n)}, {d.confidence:.0%} bounds {lo}–{hi}"
    if d.basis == "repeats":
        return f"{shown}, {d.n} repeats {lo}–{hi}"
    return f"{shown}, point" + (f" ({d.n} repeat{'s' if d.n != 1 else ''})" if d.n else "")


def _how(c: Check) -> str:
    d = c.decision
    if d.confidence is not None:
        return f"decided at {d.confidence:.0%}"
    return f"over {d.n} repeats" if d.basis == "repeats" else "as measured points"


def decided_text(s: StageVerdict) -> str:
    """What was decided: 'meets p95 ≤ 50 ms, availability ≥ 99.9% up to 10×, decided at
    95%'; 'meets its objectives at no level decided'."""
    return _decided(s.checks, s.passed_up_to)


def _decided(checks: tuple[Check, ...], reach: float | None) -> str:
    if not checks:
        return "no objectives to judge (measured only)"
    if reach is None:
        return "meets its objectives at no level decided"
    met = [c for c in checks if c.multiple == reach]
    labels = ", ".join(dict.fromkeys(c.objective.label for c in met))
    groups: dict[str, list[str]] = {}
    for c in met:
        groups.setdefault(_how(c), []).append(c.objective.label)
    how = (f", {next(iter(groups))}" if len(groups) == 1 else " (" + "; ".join(
        f"{', '.join(dict.fromkeys(ls))} {h}" for h, ls in groups.items()) + ")")
    return f"meets {labels} up to {format_multiple(reach)}{how}"


def need_text(n: Need) -> str:
    """What would decide one check: '2,995 requests (measured 1,180): 41 s at the 73
    requests/s this run measured at 10×'; the rule's own words when no count follows."""
    c = n.check
    if n.samples is None:
        if n.measured is None:
            return "a recorded sample size (the records did not say how many)"
        return (f"more than the {count_text(n.measured)} {n.unit} measured (its bounds "
                "straddle the limit)")
    had = f" (measured {count_text(n.measured)})" if n.measured is not None else ""
    pays = ""
    if n.seconds is not None and n.per_second is not None:
        pays = (f": {format_duration(n.seconds)} at the {format_number(n.per_second)} "
                f"{n.unit}/s this run measured at {format_multiple(c.multiple)}")
    return f"{count_text(n.samples)} {n.unit}{had}{pays}"


def open_text(s: StageVerdict) -> str:
    """What was not decided, at the level the verdict sizes it for (the target when it is
    undecided there, else the lowest undecided level), and what would decide it."""
    if not s.undecided:
        return ""
    first = s.needs[0].check.multiple if s.needs else min(c.multiple for c in s.undecided)
    needs = {id(n.check): n for n in s.needs}
    parts = [f"{c.objective.label} needs {need_text(needs[id(c)])}" if id(c) in needs
             else f"{c.objective.label} ({c.decision.need or decision_text(c)})"
             for c in s.undecided if c.multiple == first]
    more = sorted({c.multiple for c in s.undecided} - {first})
    return f"undecided at {format_multiple(first)}: " + "; ".join(parts) + (
        f"; also undecided at {', '.join(format_multiple(m) for m in more)}" if more else "")


def gap_text(g: Gap) -> str:
    return g.label if g.everywhere else (
        f"{g.label} (at {', '.join(format_multiple(m) for m in g.multiples)})")


def tightest_text(s: StageVerdict) -> str:
    t = s.tightest
    if t is None:
        return ""
    c = t.check
    return (f"{c.objective.label}: {format_metric(c.objective.metric, c.value)} at "
            f"{format_multiple(c.multiple)} ({format_percent(t.margin)} headroom)")


def candidate_lines(s: StageVerdict) -> list[str]:
    out = []
    for cand in s.candidates:
        head = (f"misses {cand.miss.objective.label} at {format_multiple(cand.miss.multiple)} "
                f"({decision_text(cand.miss)})" if cand.miss is not None
                else _decided(cand.checks, cand.passed_up_to))
        if cand.undecided:
            first = min(c.multiple for c in cand.undecided)
            head += f"; undecided at {format_multiple(first)}: " + "; ".join(
                c.objective.label for c in cand.undecided if c.multiple == first)
        out.append(f"{cand.series}: {head}")
    return out


def limit_text(e: Evidence) -> str:
    return f"{e.resource} — {e.detail}"


def headline(v: Verdict) -> str:
    """The verdict in one sentence: the first miss with its limit and action; otherwise how
    far each stage was decided to hold; failed stages first."""
    failed = "".join(f"{s.stage} failed: {s.failure}. " for s in v.stages if s.failure)
    first = v.first
    if first is not None and first.miss is not None:
        lim = first.limiting[0] if first.limiting else None
        return failed + (
            f"{first.stage} misses first: {first.miss.objective.label} fails at "
            f"{format_multiple(first.miss.multiple)} ({decision_text(first.miss)})"
            + (f"; limiting resource: {lim.resource} ({lim.detail})" if lim else "")
            + (f". Do: {first.intervention}" if first.intervention else ""))
    judged = [s for s in v.stages if s.measured and s.checks and s.failure is None]
    held = [s for s in judged if s.outcome == "met"]
    parts = ["no stage misses its objectives at the levels measured"]
    parts.append("decided met: " + ", ".join(
        f"{s.stage} to {format_multiple(s.passed_up_to)}" for s in held) if held
        else "none decided met at every level")
    for s in judged:
        if s.outcome != "undecided":
            continue
        said = [f"met to {format_multiple(s.passed_up_to)}"] if s.passed_up_to else []
        said += [open_text(s)] if s.undecided else []
        said += ["not measured: " + ", ".join(gap_text(g) for g in s.not_measured)
                 ] if s.not_measured else []
        parts.append(f"{s.stage} " + ", ".join(said))
    parts += [f"{s.stage} not measured" for s in v.stages
              if not s.measured and s.failure is None]
    tight = "; ".join(f"{s.stage}: {tightest_text(s)}" for s in held if s.tightest)
    return failed + "; ".join(parts) + (f"; least headroom — {tight}" if tight else "")


def stage_head(s: StageVerdict) -> list[str]:
    """The stage's lines: failed, missed or decided; what was not decided or measured."""
    out = [f"{s.stage}: failed: {s.failure}"] if s.failure is not None else []
    if not s.measured:
        return out or [f"{s.stage}: not measured"]
    lead = "  measured: " if out else f"{s.stage}: "
    if s.miss is not None:
        out.append(f"{lead}misses {s.miss.objective.label} at "
                   f"{format_multiple(s.miss.multiple)} ({decision_text(s.miss)})")
        if s.passed_up_to is not None:
            out.append(f"  decided: {decided_text(s)}")
    else:
        out.append(lead + decided_text(s))
    if s.undecided:
        out.append(f"  {open_text(s)}")
    if s.not_measured:
        out.append("  not measured: " + ", ".join(gap_text(g) for g in s.not_measured))
    out += [f"  {said}" for said in s.decided_by]
    if s.curve_multiples:
        out.append("  curve points (measured for the picture, not decisions): "
                   + ", ".join(format_multiple(m) for m in s.curve_multiples))
    out += [f"  candidate {line}" for line in candidate_lines(s)]
    return out


def stage_advice(s: StageVerdict) -> list[tuple[str, str]]:
    """(label, text) of the intervention, its predicted effect and the least headroom."""
    advice = [("do", s.intervention), ("predicted", s.predicted),
              ("least headroom", tightest_text(s))]
    return [(label, text) for label, text in advice if text]


def cost_text(s: StageVerdict) -> str:
    return ", ".join(f"{format_multiple(c.multiple)} {format_usd(c.usd)}/{c.unit}"
                     for c in s.cost)


def verdict_lines(v: Verdict) -> list[str]:
    """The long verdict: the headline, then each stage's lines."""
    lines = [headline(v)]
    for s in v.stages:
        lines += stage_head(s)
        if not s.measured:
            continue
        lines += [f"  limiting: {limit_text(e)}" for e in s.limiting[:3]]
        lines += [f"  {label}: {text}" for label, text in stage_advice(s)]
        if s.cost:
            lines.append(f"  cost per unit: {cost_text(s)}")
    return lines


def target_text(s: StageVerdict) -> str:
    """The target multiple, or a dash for a stage the goals did not name."""
    return "—" if math.isnan(s.target_multiple) else format_multiple(s.target_multiple)
