"""The limits each stage itself recorded, as inputs to the verdict.

The verdict core infers limits from the signals every stage shares (CPU busy cores, memory,
queue growth, communication, the serial fraction). A stage that records more (the llm stage's
engine /metrics: sequences waiting for a batch slot, KV-cache usage, preemptions) names them
through its `Stage.limits` hook; `core.verdict.judge` puts them first in the stage's limiting
evidence, so the report's limiting line agrees with the "do" line that already reads them.
"""

from __future__ import annotations

from typing import Any

from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import StageGoal
from scalelab.lab.diagnose.stages import STAGES


def baseline_rows(goal: StageGoal, sheet: list[SheetRow]) -> list[SheetRow]:
    """The rows the verdict judges the stage on (its baseline series, else its first)."""
    by_series: dict[str, list[SheetRow]] = {}
    for r in sheet:
        if r.stage == goal.stage:
            by_series.setdefault(r.series, []).append(r)
    return by_series.get(goal.baseline_series) or next(iter(by_series.values()), [])


def stage_limits(
    goals: list[StageGoal], sheet: list[SheetRow], cfg: Any, *, cores: int
) -> dict[str, list[Evidence]]:
    """Stage name -> the limits its own hook read off its rows (stages without any left out)."""
    hooks = {name: st for st in STAGES for name in st.stage_names(st.of(cfg))}
    out: dict[str, list[Evidence]] = {}
    for goal in goals:
        st = hooks.get(goal.stage)
        if st is None:
            continue
        own = st.limits(st.of(cfg), baseline_rows(goal, sheet), cores=cores)
        if own:
            out[goal.stage] = list(own)
    return out
