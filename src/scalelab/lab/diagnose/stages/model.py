"""The model stage: compression and routing variants of the trained flights model."""

from __future__ import annotations

from pydantic import Field

from scalelab.lab.core.objectives import Objective, metric_value
from scalelab.lab.core.records import Record
from scalelab.lab.core.verdict import Advice, AdviceInput, StageGoal, num_text
from scalelab.lab.diagnose.commands import Compress
from scalelab.lab.diagnose.schema import StageSettings
from scalelab.lab.diagnose.stages.base import Artifact, Context, Stage
from scalelab.lab.diagnose.stages.train import FEATURES, SERVED_MODEL
from scalelab.lab.diagnose.steps import Step
from scalelab.layers.nets.repository import versions

BASELINE = "fp32"
"""The series of the uncompressed model (today's system)."""


class ModelSettings(StageSettings):
    """`stages.model`: which variants `scalelab compress` builds and measures."""

    variants: list[str] = Field(default_factory=lambda: ["int8", "prune-structured-50", "distill"])
    """Variant names as `scalelab compress --variants` takes them."""


def relative_metrics(objectives: list[Objective]) -> frozenset[str]:
    """Quality deltas against fp32 are 0 on fp32 by construction: judged on the variants."""
    return frozenset(o.metric for o in objectives
                     if o.metric.startswith("quality:") and "delta" in o.metric)


def variant_series(r: Record) -> Record:
    """Each variant is a series; the uncompressed model is the baseline."""
    variant = r.extras.get("variant")
    return r.model_copy(
        update={"series": BASELINE if variant in (None, "baseline", "fp32") else str(variant)}
    )


def advise(inp: AdviceInput) -> Advice:
    """The variant that meets every objective with the lowest p95 latency."""
    goal = inp.goal
    best: tuple[float, str] | None = None
    base_rows = inp.by_series.get(goal.baseline_series, [])
    base_p95 = base_rows[0].p95_ms if base_rows else None
    for s, rows in inp.by_series.items():
        row = rows[0]
        meets = all(
            o.passes(metric_value(row, o.metric, rows)) is not False for o in goal.objectives
        )
        if meets and row.p95_ms is not None and (best is None or row.p95_ms < best[0]):
            best = (row.p95_ms, s)
    if best is None or best[1] == goal.baseline_series:
        return Advice(
            intervention="no variant beats the baseline within the quality tolerance: route "
            "(cascade) or retrain a smaller model"
        )
    return Advice(
        intervention=f"compress: serve {best[1]}",
        predicted=f"{best[1]}: p95 {num_text(base_p95)} → {best[0]:.3g} ms within the quality "
        "objectives",
    )


class ModelStage(Stage[ModelSettings]):
    name = "model"
    settings = ModelSettings

    def needs(self, s: ModelSettings) -> tuple[Artifact, ...]:
        return (FEATURES, SERVED_MODEL)

    def count(self, s: ModelSettings, repeats: int) -> int:
        return 1

    def run(self, s: ModelSettings, ctx: Context) -> None:
        repo = ctx.artifact(SERVED_MODEL)
        if repo is None:
            return
        found = versions(repo, "flights")
        if not found:
            return
        rec = ctx.records("model")
        cmd = Compress(model=repo / "flights" / str(found[-1]), variants=s.variants,
                       data=ctx.artifact(FEATURES), price_per_core_hour=ctx.prices.core_hour_usd,
                       price_per_gpu_hour=ctx.prices.gpu_hour_usd, records=rec)
        ctx.run(
            Step(stage=self.name, label="compress " + ",".join(s.variants), command=cmd,
                 records=rec, tag=variant_series, timeout_s=1200)
        )

    def goals(self, s: ModelSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(), baseline_series=BASELINE,
                      target_multiple=s.target_multiple, advisor=advise,
                      candidate_metrics=relative_metrics(s.built_objectives()))
        ]


STAGE = ModelStage()
