"""A user's endpoint loaded level by level, each level sized sequentially (diagnose.sizing):
what the custom `load` stages and `stages.serve.url` run instead of one step over all rates.

Each level is chunks of `scalelab load run` at its one rate until its objectives are decided or
its share of the stage's time is spent; the merged record of each level goes to the run's
records and to the stage's own records file (which the capacity search's start reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record, append_records
from scalelab.lab.core.units import parse_duration
from scalelab.lab.diagnose.commands import LoadRun
from scalelab.lab.diagnose.sizing import LevelClock, size_level
from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.steps import Step, StepResult

FULL_LEVEL_CAP_S = 60.0
"""With --full, the most one level of a user's endpoint runs while still undecided."""
STEP_START_S = 1.0
"""A load step's process start-up beside its warm-up and window (2-core machine)."""
WARMUP_S = 1.0
"""`load run`'s default warm-up, which these levels keep."""


def least_s(cmd: LoadRun, levels: int) -> float:
    """Seconds of one chunk a level: what the stage needs at least for its levels."""
    warm = parse_duration(cmd.warmup) if cmd.warmup else WARMUP_S
    return levels * (parse_duration(cmd.duration) + warm + STEP_START_S)


def sized_levels(ctx: Context, *, budget_key: str, stage: str, label: str, cmd: LoadRun,
                 objectives: list[Objective], series: str | None,
                 tag: Callable[[Record], Record] | None, rec: Path,
                 reserve_s: float = 0.0, paid_only: bool = False) -> bool:
    """Run `cmd`'s rates one sized level each; True when every chunk's step succeeded (what
    a single step over all rates reported as its `ok`). `paid_only`: each level's later chunk
    sends the largest count its share pays, the level stopping when it pays none
    (`sizing.size_level`)."""
    first = parse_duration(cmd.duration)
    clock = LevelClock(share_s=ctx.shares.get(budget_key), levels=len(cmd.rates),
                       cap_s=FULL_LEVEL_CAP_S if ctx.full else first, reserve_s=reserve_s)
    results: list[StepResult] = []
    merged: list[Record] = []
    rec.parent.mkdir(parents=True, exist_ok=True)
    for rate in cmd.rates:

        def chunk(seconds: float, index: int, rate: float = rate) -> Record | None:
            crec = ctx.records(f"{rec.stem}-{rate:g}-{index}")
            more = f" +{index}" if index else ""
            res = ctx.run(Step(stage=stage, label=f"{label} {rate:g}/s{more}",
                               command=replace(cmd, rates=[rate], records=crec,
                                               duration=f"{seconds:.3g}s"),
                               records=crec, series=series, tag=tag, keep=False,
                               timeout_s=600))
            results.append(res)
            return res.records[0] if res.records else None

        level = size_level(chunk, objectives, first_s=first, share_s=clock.next_share(),
                           paid_only=paid_only)
        if level is not None:
            merged.append(level)
    ctx.keep(merged)
    append_records(rec, merged)
    return bool(results) and all(r.ok for r in results)
