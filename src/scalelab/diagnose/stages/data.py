"""The data stage: the flights pipeline at growing volume (1×, 2×, 5×, 10× today's rows)."""

from __future__ import annotations

from pydantic import Field

from scalelab.core.verdict import Advice, AdviceInput, StageGoal, curve_prediction
from scalelab.diagnose.commands import DataBench
from scalelab.diagnose.schema import StageSettings
from scalelab.diagnose.stages.base import Context, Stage
from scalelab.diagnose.steps import Step


class DataSettings(StageSettings):
    """`stages.data`: the pipeline over growing copies of the flights."""

    levels: list[float] = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base volume."""
    sample_rows: int = Field(default=30000, ge=1000)
    """Rows of flights per copy at 1× (the whole year is 336,776)."""


_QUALITY_METRICS = ("failure_rate", "availability", "extras:quarantine_rate")


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
    return Advice(intervention=text, predicted=curve_prediction(inp.base))


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
