"""The model stage: compression and routing variants of the trained flights model."""

from __future__ import annotations

from pydantic import Field

from scalelab.lab.core.objectives import Objective, metric_value
from scalelab.lab.core.records import Record
from scalelab.lab.core.verdict import Advice, AdviceInput, StageGoal, num_text
from scalelab.lab.diagnose.budget import Part, Work
from scalelab.lab.diagnose.commands import Compress
from scalelab.lab.diagnose.schema import StageSettings
from scalelab.lab.diagnose.stages.base import Artifact, Context, FixedStage
from scalelab.lab.diagnose.stages.train import FEATURES, SERVED_MODEL
from scalelab.lab.diagnose.steps import Step
from scalelab.layers.nets.repository import versions

BASELINE = "fp32"
"""The series of the uncompressed model (today's system)."""
START_S = 1.0
"""Quiet 2-core seconds of `scalelab compress` beside its variants: its start (torch), the
model and the test rows read, the uncompressed model measured. The costs here split the
stage's quiet 7 s (demos of 2026-12-03: 6–8 s) by CPU seconds at load 11 (2026-12-07): 20.8
with int8, prune-structured-50 and distill, 4.6 with int8 alone."""
VARIANT_S = {"int8": 0.5, "prune": 2.7, "distill": 2.8, "cascade": 2.8}
"""Quiet seconds each kind of variant adds (by its name's first word): int8 quantizes, the
others fine-tune or train a student."""
OTHER_VARIANT_S = 2.8


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


def variant_s(variant: str) -> float:
    """Quiet 2-core seconds one variant adds to `scalelab compress` (pure): its build (a
    fine-tune or a student trained for some) and its measurement."""
    return VARIANT_S.get(variant.split("-")[0], OTHER_VARIANT_S)


class ModelStage(FixedStage[ModelSettings]):
    name = "model"
    settings = ModelSettings

    def needs(self, s: ModelSettings) -> tuple[Artifact, ...]:
        return (FEATURES, SERVED_MODEL)

    def count(self, s: ModelSettings, repeats: int) -> int:
        return 1

    def work(self, s: ModelSettings, repeats: int) -> Work:
        """The uncompressed model's measurement (the decision at 1x) is fixed; the first
        variant is needed (the quality objectives are judged on the variants), the others are
        candidates."""
        return Work(fixed_s=START_S, parts=tuple(
            Part(name=v, cost_s=variant_s(v), needed=i == 0, role="candidate series")
            for i, v in enumerate(s.variants)))

    def run(self, s: ModelSettings, ctx: Context) -> None:
        repo = ctx.artifact(SERVED_MODEL)
        if repo is None:
            return
        found = versions(repo, "flights")
        if not found:
            return
        plan = self.plan(s, ctx)
        if self.hopeless(ctx, plan.cost_s):
            return
        variants = [p.name for p in plan.kept]
        rec = ctx.records("model")
        cmd = Compress(model=repo / "flights" / str(found[-1]), variants=variants,
                       data=ctx.artifact(FEATURES), price_per_core_hour=ctx.prices.core_hour_usd,
                       price_per_gpu_hour=ctx.prices.gpu_hour_usd, records=rec)
        ctx.run(
            Step(stage=self.name, label="compress " + ",".join(variants), command=cmd,
                 records=rec, tag=variant_series, timeout_s=1200, estimate_s=plan.cost_s)
        )

    def goals(self, s: ModelSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(), baseline_series=BASELINE,
                      target_multiple=s.target_multiple, advisor=advise,
                      candidate_metrics=relative_metrics(s.built_objectives()))
        ]


STAGE = ModelStage()
