"""One capacity search of the serve stage: `scalelab load capacity` at the stage's latency
objective, its steps sized by the rule they are judged by, started where the server's own
level sweep says (`serve_curve.grid_bounds`) and never re-measuring a rate the levels already
decided to miss.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from scalelab.lab.core.objectives import slo_text
from scalelab.lab.core.records import Record, read_records
from scalelab.lab.core.units import parse_duration
from scalelab.lab.diagnose.commands import LoadCapacity
from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.stages.serve_config import MODEL, ServeSettings
from scalelab.lab.diagnose.stages.serve_curve import (
    CAPACITY,
    search_requests,
    step_seconds,
)
from scalelab.lab.diagnose.steps import Step, restage

SEARCH_WARMUP = "0.5s"
SEARCH_CONFIRM_S = 10.0
"""Each search's answer is confirmed by a run this long at its rate before the advice divides
by it (five steps' floor where the stage's `capacity_step` is shorter than 2 s): shorter than
`load capacity`'s 30 s under diagnose's time budget (the outcome says so)."""


SEARCH_START_S = 5.0
"""A search's process start-up (python and its imports), kept out of the time it is given."""


def search_budget(ctx: Context) -> str | None:
    """`load capacity --budget` for a search started now: what is left of the stage's share,
    less its start-up, so that it ends itself (its records written; an answer it had no time to
    confirm reported so) before the stage's deadline stops it (None: no budget)."""
    left = ctx.left_s()
    return None if left is None else f"{max(left - SEARCH_START_S, 1.0):.1f}s"


def confirm_length(capacity_step: str) -> str:
    """`load capacity --confirm` for a stage whose steps' floor is `capacity_step`."""
    return f"{min(SEARCH_CONFIRM_S, 5 * parse_duration(capacity_step)):g}s"


def search_path(ctx: Context, series: str) -> Path:
    """Where the search of `series` writes its steps' records (read after it ran)."""
    return ctx.work / "records" / f"serve-capacity-{series}.jsonl"


def passed_rates(path: Path) -> list[float]:
    """The rates a finished search decided to pass (the rate the search counted)."""
    return [r.level for r in (read_records(path) if path.is_file() else [])
            if r.extras.get("rate_verdict", r.extras.get("verdict")) == "pass"]


def run_search(s: ServeSettings, ctx: Context, *, stage: str, series: str, url: str,
               repo: Path | None, data: Path | None,
               tag: Callable[[Record], Record] | None = None, start: float | None = None,
               fails_at: float | None = None) -> None:
    """Search `url` for the highest rate meeting the objectives (series '<series> capacity');
    nothing without `capacity` or a latency objective."""
    objectives = s.built_objectives()
    slo = slo_text(objectives, availability=s.capacity_availability)
    if not s.capacity or slo is None:
        return
    floor_s = parse_duration(s.capacity_step)
    # Sized by the rule: a step shorter than the requests its quantile needs can only end
    # undecided, and an undecided step says nothing about the rate (it is not a miss).
    need = search_requests(objectives, availability=s.capacity_availability)
    first = start or s.base_rate
    step_s = step_seconds(need, first, floor_s)
    max_rate = s.base_rate * max(s.levels) * 20
    rec = ctx.records(f"serve-capacity-{series}")
    cmd = LoadCapacity(url=url, slo=slo,
                       start=min(first, max_rate), max_rate=max_rate,
                       fails_at=fails_at if fails_at is not None and fails_at > first else None,
                       min_step=f"{floor_s / 2:g}s", max_step=f"{step_s:g}s",
                       max_steps=s.capacity_max_steps, warmup=SEARCH_WARMUP, records=rec,
                       confirm=confirm_length(s.capacity_step),
                       payload="flights" if repo else None, model=MODEL if repo else None,
                       model_repo=repo, data=data, budget=search_budget(ctx), **s.access())
    ctx.run(Step(stage=stage, label=f"serve {series} capacity", command=cmd, records=rec,
                 series=series + CAPACITY,
                 tag=tag or functools.partial(restage, stage=stage), timeout_s=600))
