"""The data stage: the flights pipeline at growing volume (1×, 2×, 5×, 10× today's rows)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import (
    Advice,
    AdviceInput,
    StageGoal,
    curve_prediction,
    extrapolation,
)
from scalelab.lab.diagnose.budget import Part, Work
from scalelab.lab.diagnose.commands import DataBench
from scalelab.lab.diagnose.schema import Levels, StageSettings
from scalelab.lab.diagnose.sizing import target_level
from scalelab.lab.diagnose.stages.base import Context, FixedStage
from scalelab.lab.diagnose.steps import Step


class DataSettings(StageSettings):
    """`stages.data`: the pipeline over growing copies of the flights."""

    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base volume."""
    sample_rows: int = Field(default=30000, ge=1000)
    """Rows of flights per copy at 1× (the whole year is 336,776)."""


DEMO_ROWS = 30000
"""The rows a copy the costs below were measured at (the default `sample_rows`)."""
START_S = 2.0
"""Quiet 2-core seconds of the bench's start: imports and the flights sample read. The costs
here split the stage's quiet 8 s (demos of 2026-12-03: 7–10 s at load 0.5–3.7) by the CPU
seconds of the bench at load 11 (2026-12-07): 8.4 CPU-s at 1, 2, 5, 10x (the pipeline's
0.38, 0.52, 1.02 and 2.03 of it), 7.1 at 1 and 10x: the copies are drawn once for the
highest level, the lower ones read them again."""
GEN_S_PER_COPY = 0.24
"""Quiet seconds a copy of the highest level takes to draw (the lower levels share them)."""
LEVEL_S = 0.15
"""Quiet seconds of a level's pipeline beside its rows (its steps' fixed work, the manifest)."""
PER_COPY_S = 0.19
"""Quiet seconds a copy of `sample_rows` flights adds to a level's pipeline."""

_QUALITY_METRICS = ("failure_rate", "availability", "extras:quarantine_rate")


def freshness_reach(rows: list[SheetRow], objectives: list[Objective]) -> str:
    """The largest volume multiple whose batch still lands within the wall-time objective,
    from a least-squares line of wall time on volume, labelled as the extrapolation it is."""
    window = next((o for o in objectives if o.metric == "wall_s" and o.max is not None), None)
    pts = [(r.level, r.wall_s) for r in rows if r.wall_s is not None]
    if window is None or window.max is None or len({k for k, _ in pts}) < 2:
        return ""
    slope, intercept = np.polyfit([k for k, _ in pts], [w for _, w in pts], 1)
    if slope <= 0:
        return ""
    reach = (window.max - intercept) / slope
    last = max(k for k, _ in pts)
    if reach <= 0:
        return f"{window.label}: missed at every measured volume"
    return (
        f"{window.label} holds up to ≈{reach:.3g}× the base volume (a line through wall time "
        f"against volume, {slope:.3g} s per 1×; {extrapolation(reach, last)})"
    )


def advise(inp: AdviceInput) -> Advice:
    """Validate when bad rows break the objective; otherwise partition."""
    if inp.miss is not None and inp.miss.objective.metric in _QUALITY_METRICS:
        text = (
            "validate: the failure (quarantine) rate breaks the objective — fix the "
            "source or add checks upstream; more machines only multiply bad rows"
        )
    else:
        text = (
            "partition: split the input and run partitions in parallel (--engine dask "
            "--workers N); validate at ingest so bad rows stop early"
        )
    parts = [p for p in (curve_prediction(inp.base),
                         freshness_reach(inp.base, inp.goal.objectives)) if p]
    return Advice(intervention=text, predicted="; ".join(parts))


def level_name(level: float) -> str:
    return f"{level:g}×"


def run_order(levels: list[float], target: float) -> list[float]:
    """The levels in the order the bench runs them (pure): the base (the multiples are read
    against it), the target, then the others lowest first, so a run stopped at its deadline
    has decided the target first (the bench writes a level's record as it ends)."""
    ordered = sorted(levels)
    base, top = ordered[0], target_level(ordered, target)
    return [base, *([top] if top != base else []),
            *(x for x in ordered if x not in (base, top))]


class DataStage(FixedStage[DataSettings]):
    name = "data"
    settings = DataSettings

    def count(self, s: DataSettings, repeats: int) -> int:
        return 1

    def work(self, s: DataSettings, repeats: int) -> Work:
        order = run_order(s.levels, s.target_multiple)
        rows = s.sample_rows / DEMO_ROWS
        return Work(fixed_s=START_S + GEN_S_PER_COPY * rows * max(order[:2]), parts=tuple(
            Part(name=level_name(k), cost_s=repeats * rows * (LEVEL_S + PER_COPY_S * k),
                 needed=i < 2)
            for i, k in enumerate(order)))

    def run(self, s: DataSettings, ctx: Context) -> None:
        plan = self.plan(s, ctx)
        if self.hopeless(ctx, plan.cost_s):
            return
        kept = {p.name for p in plan.kept}
        levels = [k for k in run_order(s.levels, s.target_multiple) if level_name(k) in kept]
        rec = ctx.records("data")
        cmd = DataBench(
            scale=levels,
            sample=s.sample_rows,
            repeats=ctx.repeats,
            work=ctx.work / "data-bench",
            price_per_core_hour=ctx.prices.core_hour_usd,
            records=rec,
        )
        text = ",".join(f"{v:g}" for v in levels)
        ctx.run(
            Step(stage=self.name, label=f"data pipeline at {text}×", command=cmd, records=rec,
                 timeout_s=900, estimate_s=plan.cost_s)
        )

    def goals(self, s: DataSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(),
                      target_multiple=s.target_multiple, advisor=advise)
        ]


STAGE = DataStage()
