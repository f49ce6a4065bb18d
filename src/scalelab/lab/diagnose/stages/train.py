"""The training stage: the data-parallel trainer at 1, 2, 4 workers (strong scaling).

It also owns the two shared inputs the later stages read: the flights features (made by the
data pipeline from a fresh sample) and the served model (one short training run exported to a
model repository).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import Field

from scalelab.lab.core.verdict import Advice, AdviceInput, StageGoal, curve_prediction
from scalelab.lab.diagnose.commands import DataGenerate, DataRun, Train, TrainBench
from scalelab.lab.diagnose.schema import StageSettings
from scalelab.lab.diagnose.stages.base import Artifact, Context, Stage
from scalelab.lab.diagnose.steps import Step

SERIES = "strong"
"""The series of the worker sweep (fixed global batch)."""
SERVED_BATCH = 512
"""The served model's batch (`scalelab train`'s --base-batch): the sweep's global batch is
for throughput; two epochs at 32,768 would be a handful of steps, an untrained model."""
FEATURE_ROWS_MIN = 20000
"""The smallest features sample: the test split must keep enough rows per class."""


class TrainSettings(StageSettings):
    """`stages.train`: the worker sweep and the model the later stages serve and compress."""

    workers: list[int] = Field(default_factory=lambda: [1, 2, 4])
    """Data-parallel process counts (must start at 1: efficiency is relative to it)."""
    steps: int = Field(default=30, ge=1)
    """Optimizer steps per worker count."""
    batch: int = Field(default=32768, ge=1)
    """Global batch (strong scaling: the same at every worker count): the trainer's own
    scaling setting (benchmarks/bench_train.py: 86% efficiency at 2 workers at 32,768)."""
    limit_rows: int = Field(default=100000, ge=1000)
    """Training rows read (also the size of the features sample the other stages use)."""


def _settings(ctx: Context) -> TrainSettings:
    s = ctx.settings.get("train")
    return s if isinstance(s, TrainSettings) else TrainSettings()


def _features(ctx: Context) -> Path | None:
    gen, ds = ctx.work / "flights-gen", ctx.work / "dataset"
    rows = max(_settings(ctx).limit_rows, FEATURE_ROWS_MIN)
    r = ctx.run(
        Step(stage="data", label="prepare features",
             command=DataGenerate(scale=[1], sample=rows, out=gen), timeout_s=300)
    )
    if not r.ok:
        return None
    r = ctx.run(
        Step(stage="data", label="pipeline to features",
             command=DataRun(input=gen / "x1", out=ds, lineage=ctx.work / "lineage.db"),
             timeout_s=300)
    )
    return ds if r.ok else None


FEATURES = Artifact(name="features", steps=2, build=_features)
"""A flights dataset directory (train.parquet, test.parquet) from the data pipeline."""


def _served_model(ctx: Context) -> Path | None:
    t = _settings(ctx)
    repo = ctx.work / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    cmd = Train(nproc=1, limit=t.limit_rows, epochs=2, batch=min(t.batch, SERVED_BATCH),
                data=ctx.artifact(FEATURES), repo=repo, lineage=ctx.work / "lineage.db")
    r = ctx.run(Step(stage="train", label="train the served model", command=cmd, timeout_s=900))
    return repo if r.ok else None


SERVED_MODEL = Artifact(name="served-model", steps=1, build=_served_model, needs=(FEATURES,))
"""A model repository holding the trained flights model (REPO/flights/<version>/)."""


def advise(inp: AdviceInput) -> Advice:
    names = {e.resource for e in inp.limits}
    if "communication" in names:
        text = (
            "fix communication: larger per-worker batches or gradient accumulation "
            "(fewer all-reduces per sample), then parallelize"
        )
    elif "cpu" in names:
        text = (
            "the cores are saturated: more processes only oversubscribe; add cores or "
            "nodes (torchrun --nnodes) and checkpoint on Daly's interval"
        )
    else:
        text = "parallelize (data-parallel workers) and checkpoint on Daly's interval"
    return Advice(intervention=text, predicted=curve_prediction(inp.base, cores=inp.cores))


class TrainStage(Stage[TrainSettings]):
    name = "train"
    settings = TrainSettings

    def needs(self, s: TrainSettings) -> tuple[Artifact, ...]:
        return (FEATURES,)

    def count(self, s: TrainSettings, repeats: int) -> int:
        return 1

    def run(self, s: TrainSettings, ctx: Context) -> None:
        rec = ctx.records("train")
        cmd = TrainBench(nproc=s.workers, mode="strong", batch=s.batch, steps=s.steps,
                         limit=s.limit_rows, data=ctx.artifact(FEATURES),
                         price_per_core_hour=ctx.prices.core_hour_usd, records=rec)
        ctx.run(
            Step(stage=self.name, label="train workers " + ",".join(map(str, s.workers)),
                 command=cmd, records=rec, series=SERIES, timeout_s=1200)
        )

    def goals(self, s: TrainSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(), baseline_series=SERIES,
                      target_multiple=s.target_multiple, advisor=advise)
        ]


STAGE = TrainStage()
