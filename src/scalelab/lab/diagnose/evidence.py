"""The limiting lines of each stage, with the signals the stage itself recorded.

The verdict core infers limits from the signals every stage shares (CPU busy cores, memory,
queue growth, communication, the serial fraction). A stage that records more (the llm stage's
engine /metrics: sequences waiting for a batch slot, KV-cache usage, preemptions) names them
through its `Stage.limits` hook; they lead its limiting lines here, so the line the report
prints agrees with the "do" line that already reads them, instead of saying "not measured".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import StageGoal, Verdict
from scalelab.lab.diagnose.stages import STAGES

PLACEHOLDERS = ("not measured", "none saturated")
"""Inferred lines that only say nothing saturated: a stage-recorded limit replaces them."""


def baseline_rows(goal: StageGoal, sheet: list[SheetRow]) -> list[SheetRow]:
    """The rows the verdict judged the stage on (its baseline series, else its first)."""
    by_series: dict[str, list[SheetRow]] = {}
    for r in sheet:
        if r.stage == goal.stage:
            by_series.setdefault(r.series, []).append(r)
    return by_series.get(goal.baseline_series) or next(iter(by_series.values()), [])


def with_stage_limits(
    verdict: Verdict, goals: list[StageGoal], sheet: list[SheetRow], cfg: Any, *, cores: int
) -> Verdict:
    """The verdict with each stage's own recorded limits leading its limiting lines (and in
    the summary when that stage misses first)."""
    hooks = {name: st for st in STAGES for name in st.stage_names(st.of(cfg))}
    summary = verdict.summary
    for goal in goals:
        st = hooks.get(goal.stage)
        sv = next((v for v in verdict.stages if v.stage == goal.stage), None)
        if st is None or sv is None:
            continue
        own = st.limits(st.of(cfg), baseline_rows(goal, sheet), cores=cores)
        if not own:
            continue
        old = sv.limiting[0] if sv.limiting else None
        sv.limiting = [*own, *(e for e in sv.limiting if e.resource not in PLACEHOLDERS)]
        if verdict.first is sv:
            new = f"limiting resource: {own[0].resource} ({own[0].detail})"
            said = f"limiting resource: {old.resource} ({old.detail})" if old else None
            if said and said in summary:
                summary = summary.replace(said, new)
            elif old is None and ". Do:" in summary:
                summary = summary.replace(". Do:", f"; {new}. Do:", 1)
    return replace(verdict, summary=summary)

