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
from scalelab.lab.diagnose.commands import DataBench
from scalelab.lab.diagnose.schema import Levels, StageSettings
from scalelab.lab.diagnose.stages.base import Context, Stage
from scalelab.lab.diagnose.steps import Step


class DataSettings(StageSettings):
    """`stages.data`: the pipeline over growing copies of the flights."""

    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base volume."""
    sample_rows: int = Field(default=30000, ge=1000)
    """Rows of flights per copy at 1× (the whole year is 336,776)."""


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


class DataStage(Stage[DataSettings]):
    name = "data"
    settings = DataSettings

    def count(self, s: DataSettings, repeats: int) -> int:
        return 1

    def run(self, s: DataSettings, ctx: Context) -> None:
        rec = ctx.records("data")
        cmd = DataBench(
            scale=s.levels,
            sample=s.sample_rows,
            repeats=ctx.repeats,
            work=ctx.work / "data-bench",
            price_per_core_hour=ctx.prices.core_hour_usd,
            records=rec,
        )
        levels = ",".join(f"{v:g}" for v in s.levels)
        ctx.run(
            Step(stage=self.name, label=f"data pipeline at {levels}×", command=cmd, records=rec,
                 timeout_s=900)
        )

    def goals(self, s: DataSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(),
                      target_multiple=s.target_multiple, advisor=advise)
        ]


STAGE = DataStage()
