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
from scalelab.lab.diagnose.budget import Part, Plan, Work
from scalelab.lab.diagnose.commands import DataGenerate, DataRun, Train, TrainBench
from scalelab.lab.diagnose.schema import StageSettings
from scalelab.lab.diagnose.sizing import target_level
from scalelab.lab.diagnose.stages.base import Artifact, Context, FixedStage
from scalelab.lab.diagnose.steps import Step

SERIES = "strong"
"""The series of the worker sweep (fixed global batch)."""
SERVED_BATCH = 512
"""The served model's batch (`scalelab train`'s --base-batch): the sweep's global batch is
for throughput; two epochs at 32,768 would be a handful of steps, an untrained model."""
FEATURE_ROWS_MIN = 20000
"""The smallest features sample: the test split must keep enough rows per class."""
FEATURES_S = 3.5
"""Quiet 2-core seconds of the features' two steps (100,000 flights generated, then the
pipeline): 3 and 4 s at load 9 (2026-12-07)."""
SERVED_EPOCHS = 2
"""Epochs the served model trains (318 steps at batch 512 on the 81,532 training rows)."""
SERVED_S = 6.5
"""Quiet 2-core seconds of training the served model on one thread: 10.9 CPU-s at load 11
(2026-12-07; its 318 steps 6.2 s of it), times 0.6, what a CPU second at that load was taken
to buy on a quiet machine (a demo at load 2.1–2.9 took 10.6 s, the input never stopped)."""
BENCH_START_S = 4.5
"""Seconds of `train bench`'s own start on the 2-core VM (interpreter, torch imported, the
dataset read). The costs here are wall seconds at batch 32,768 and 100,000 rows measured on
the 2-core VM at load 2.1–2.9 (2026-12-07, two other jobs beside it, one mostly idle): 1
worker x 10 steps 10.0 s; workers 1,4 x 10 steps 26.3 s, x 30 steps 28.8 s; workers 1,2,4 x
30 steps 34.2 s (so 2 workers add 5.4 s, and 4 workers on 2 cores 16 s: each process past
the cores starts torch on a core another is using)."""
LEVEL_S = 4.6
"""Seconds of one worker count's fixed work: the rows encoded for its run, torchrun and its
first worker started (torch imported), the test split evaluated."""
WORKER_START_S = 0.3
"""Seconds each further worker adds to a run's start while the workers fit the cores."""
WORKER_OVER_S = 5.6
"""Seconds each worker past the cores adds (4 workers on 2 cores: 2 x 5.6 s)."""
STEP_S_32K = 0.083
"""Seconds of one optimizer step at a global batch of 32,768 on one worker (20 more steps
at 1 and 4 workers cost 2.5 s: 1.5 steps' worth each)."""
CORES_MEASURED = 2
"""The cores the step time above spreads over (the 2-core machine it was measured on)."""
STEPS_LEAST = 10
"""The fewest optimizer steps a worker count runs when its share is short: the rate is the
steps' samples over their wall time, first step included, so fewer steps weigh the first
step's allocations more."""


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
             command=DataGenerate(scale=[1], sample=rows, out=gen), timeout_s=300,
             estimate_s=FEATURES_S / 2)
    )
    if not r.ok:
        return None
    r = ctx.run(
        Step(stage="data", label="pipeline to features",
             command=DataRun(input=gen / "x1", out=ds, lineage=ctx.work / "lineage.db"),
             timeout_s=300, estimate_s=FEATURES_S / 2)
    )
    return ds if r.ok else None


FEATURES = Artifact(name="features", steps=2, build=_features, minimum_s=FEATURES_S)
"""A flights dataset directory (train.parquet, test.parquet) from the data pipeline."""


def _served_model(ctx: Context) -> Path | None:
    t = _settings(ctx)
    repo = ctx.work / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    # One thread: the CLI's default (cores // processes, 2 here) made each step of this small
    # net 14x slower on the shared VM (270 against 19 ms at load 11, the same model).
    cmd = Train(nproc=1, limit=t.limit_rows, epochs=SERVED_EPOCHS,
                batch=min(t.batch, SERVED_BATCH), threads=1, data=ctx.artifact(FEATURES),
                repo=repo, lineage=ctx.work / "lineage.db")
    r = ctx.run(Step(stage="train", label="train the served model", command=cmd, timeout_s=900,
                     estimate_s=SERVED_S))
    return repo if r.ok else None


SERVED_MODEL = Artifact(name="served-model", steps=1, build=_served_model, needs=(FEATURES,),
                        minimum_s=SERVED_S)
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


def worker_order(workers: list[int], target: float) -> list[int]:
    """Worker counts by what the decision needs (pure): 1 (efficiency is read against it),
    the target, then the others lowest first."""
    ordered = sorted(workers)
    top = int(target_level([float(n) for n in ordered], target))
    return [ordered[0], *([top] if top != ordered[0] else []),
            *(n for n in ordered if n not in (ordered[0], top))]


def level_s(workers: int, steps: int, batch: int) -> float:
    """Quiet 2-core seconds of one worker count's run (pure): its fixed work and its steps,
    whose time grows with the global batch and shrinks with the cores its workers share."""
    fit = min(workers, CORES_MEASURED)
    per_step = STEP_S_32K * batch / 32768 / fit
    return (LEVEL_S + (fit - 1) * WORKER_START_S + (workers - fit) * WORKER_OVER_S
            + steps * per_step)


def fewer_steps(plan: Plan, s: TrainSettings, kept: list[int]) -> int:
    """The optimizer steps a level that fit the share (pure): the setting's when they fit or
    there is no budget; else what the share has left over the fixed work, never under
    `STEPS_LEAST` (a stage that cannot pay even that is stopped at its deadline)."""
    if plan.share_s is None:
        return s.steps
    room = plan.quiet_s - BENCH_START_S - sum(level_s(n, 0, s.batch) for n in kept)
    per_step = sum(level_s(n, 1, s.batch) - level_s(n, 0, s.batch) for n in kept)
    return max(min(s.steps, STEPS_LEAST), min(s.steps, int(room / per_step)))


class TrainStage(FixedStage[TrainSettings]):
    name = "train"
    settings = TrainSettings

    def needs(self, s: TrainSettings) -> tuple[Artifact, ...]:
        return (FEATURES,)

    def count(self, s: TrainSettings, repeats: int) -> int:
        return 1

    def work(self, s: TrainSettings, repeats: int) -> Work:
        return Work(fixed_s=BENCH_START_S, parts=tuple(
            Part(name=f"{n} worker(s)", cost_s=level_s(n, s.steps, s.batch), needed=i < 2)
            for i, n in enumerate(worker_order(s.workers, s.target_multiple))))

    def run(self, s: TrainSettings, ctx: Context) -> None:
        plan = self.plan(s, ctx)
        names = {p.name for p in plan.kept}
        kept = sorted(n for n in s.workers if f"{n} worker(s)" in names)
        steps = fewer_steps(plan, s, kept)
        estimate = BENCH_START_S + sum(level_s(n, steps, s.batch) for n in kept)
        if self.hopeless(ctx, estimate):
            return
        if steps < s.steps:
            ctx.note(f"train: {steps} optimizer steps a worker count instead of {s.steps} (the "
                     f"global batch stays {s.batch:,}): its {plan.share_s:.3g} s share at this "
                     f"run's pace ({plan.slow:.3g}× the quiet estimates) pays for ~"
                     f"{estimate * plan.slow:.3g} s; {s.steps} steps needed "
                     f"~{plan.cost_s * plan.slow:.3g} s")
        rec = ctx.records("train")
        cmd = TrainBench(nproc=kept, mode="strong", batch=s.batch, steps=steps,
                         limit=s.limit_rows, data=ctx.artifact(FEATURES),
                         price_per_core_hour=ctx.prices.core_hour_usd, records=rec)
        ctx.run(
            Step(stage=self.name, label="train workers " + ",".join(map(str, kept)),
                 command=cmd, records=rec, series=SERIES, timeout_s=1200, estimate_s=estimate)
        )

    def goals(self, s: TrainSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(), baseline_series=SERIES,
                      target_multiple=s.target_multiple, advisor=advise)
        ]


STAGE = TrainStage()
