"""The serve stage's replica sweep: one server per shape (N processes × 1 torch thread behind
one port, and 1 process × T threads on the same cores), each searched for its capacity at the
objectives, so "N replicas hold X requests/s" is a measurement (`serve_curve` reads it). The
shapes' servers start with the stage's others (`serve_servers`), before anything is measured.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from scalelab.lab.core.objectives import slo_text
from scalelab.lab.core.records import Record
from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.stages.serve_config import (
    MODEL,
    SERIES,
    ServeSettings,
    batching_repo,
    serve_cmd,
)
from scalelab.lab.diagnose.stages.serve_curve import (
    REPLICAS,
    THREADS,
    sweep_start,
)
from scalelab.lab.diagnose.stages.serve_search import passed_rates, run_search, search_path
from scalelab.lab.diagnose.stages.serve_servers import Planned, all_started, worker_pids
from scalelab.lab.diagnose.steps import Step, restage
from scalelab.layers.web.spawn import Spawned

__all__ = ["Shape", "all_started", "earlier_passes", "run_sweep", "sweep_servers",
           "sweep_shapes", "worker_pids"]


@dataclass(frozen=True, kw_only=True)
class Shape:
    """One point of the replica sweep: processes behind the one port × torch threads each."""

    processes: int
    threads: int

    @property
    def series(self) -> str:
        if self.processes == 1 and self.threads > 1:
            return f"{THREADS}{self.threads}"
        return f"{REPLICAS}{self.processes}"


def sweep_shapes(s: ServeSettings, cores: int) -> list[Shape]:
    """The replica sweep's servers (pure): each count up to `cores` as that many 1-thread
    processes, and with `threads` each count above 1 as one process with that many threads."""
    counts = sorted({n for n in s.replicas if 1 <= n <= cores})
    out = [Shape(processes=n, threads=1) for n in counts]
    if s.threads:
        out += [Shape(processes=1, threads=n) for n in counts if n > 1]
    return out


def _swept(r: Record, *, stage: str, extras: dict[str, object]) -> Record:
    r = restage(r, stage=stage)
    return r.model_copy(update={"extras": {**r.extras, **extras}})


def earlier_passes(ctx: Context, grid_pass: float | None) -> list[float]:
    """The rates the stage's one-server searches (either batching setting) and its level sweep
    (`grid_pass`) were decided to hold: what the sweep's first search starts from. Every one
    served the same model on the same cores, batched or not, so each gives the order of
    magnitude: a start too high costs one failed step, a low start one step per doubling."""
    passed = [r for series in SERIES.values() for r in passed_rates(search_path(ctx, series))]
    return passed + ([grid_pass] if grid_pass is not None else [])


def sweep_servers(s: ServeSettings, ctx: Context, repo: Path, *, cores: int) -> list[Planned]:
    """The sweep's servers, one a shape (started with the stage's others, `serve_servers`);
    none without `capacity` and a latency objective. Every shape, one worker included, keeps
    its metrics in multiprocess mode, so the sweep's points pay the same metrics cost and
    each worker shows up as files."""
    shapes = sweep_shapes(s, cores)
    if not (s.capacity and slo_text(s.built_objectives()) and shapes):
        return []
    setting = s.replicas_batching
    srepo = batching_repo(repo, ctx.work / f"repo-replicas-{setting}",
                          batching=setting == "on", serial_ms=s.serial_ms)
    return [Planned(key=shape.series,
                    command=functools.partial(serve_cmd, srepo, workers=shape.processes,
                                              torch_threads=shape.threads),
                    log=ctx.logs / f"server-{shape.series}.log", workers=shape.processes,
                    prom=ctx.work / f"prom-{shape.series}")
            for shape in shapes]


def run_sweep(s: ServeSettings, ctx: Context, repo: Path, data: Path | None, *, stage: str,
              grid_pass: float | None, cores: int, servers: dict[str, Spawned | str]) -> None:
    """The replica sweep: each shape's server (`servers`, by series, started with the stage's
    others: `sweep_servers`) searched for its capacity at the objectives.

    Each search starts at half the highest rate a server of the stage was decided to hold so
    far (the one-server searches of either batching setting, an earlier shape's, else the level
    sweep's `grid_pass`): more replicas or threads hold at least about that, and the low-rate
    steps are the slow ones (40 requests/s needs 7 s for 230 requests). A start that fails is
    halved by the search."""
    shapes = sweep_shapes(s, cores)
    if not (s.capacity and slo_text(s.built_objectives()) and shapes):
        return
    setting = s.replicas_batching
    passed = earlier_passes(ctx, grid_pass)
    for shape in shapes:
        label = f"serve {shape.series} capacity"
        spawned = servers.get(shape.series, "it was not started")
        if not isinstance(spawned, Spawned):
            ctx.fail(Step(stage=stage, label=label, command=None), spawned)
            continue
        extras = {"replicated": SERIES[setting], "server_processes": shape.processes,
                  "torch_threads": shape.threads, "ready_s": spawned.ready_s}
        run_search(s, ctx, stage=stage, series=shape.series,
                   url=f"{spawned.url}/v2/models/{MODEL}/infer", repo=repo, data=data,
                   tag=functools.partial(_swept, stage=stage, extras=extras),
                   start=sweep_start(passed, s.base_rate))
        passed += passed_rates(search_path(ctx, shape.series))
