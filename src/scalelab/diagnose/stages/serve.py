"""The serving stage: the model server under growing arrival rate, dynamic batching off and on,
and a replica sweep (N processes × 1 thread against 1 process × N threads, capacity searches).

Each batching setting gets its own copy of the trained model's repository (its serving config
rewritten through serve's own config model, `serve_config`) and its own server process on a
free loopback port; the load generator runs as a separate step per level (a chunk of it,
`diagnose.sizing`), metered on the server (`serve_meter`). With `capacity`, the server is then
searched for the highest rate meeting the objectives, starting at its highest level decided to
meet them and bisecting below its lowest level decided to miss (`serve_search`); the replica
sweep (`serve_sweep`) starts one server per shape and searches each, so "N replicas hold X
requests/s" is a measurement, and the advice (`serve_advice`) reads the searches. A setting's
one-server search is skipped where the sweep measures that very server (on N cores, 1 process
× N threads of the replicated setting). With `url`, the user's endpoint is loaded instead and
nothing is started.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path

from scalelab.core.errors import RunFailedError
from scalelab.core.records import Record
from scalelab.core.sheet import build_sheet
from scalelab.core.units import parse_duration
from scalelab.core.verdict import StageGoal
from scalelab.diagnose.commands import LoadRun
from scalelab.diagnose.sizing import LevelClock, size_level
from scalelab.diagnose.stages.base import Artifact, Context, Stage
from scalelab.diagnose.stages.endpoint import grid_start, metrics_note, metrics_url, noted
from scalelab.diagnose.stages.serve_advice import advise
from scalelab.diagnose.stages.serve_config import (
    MODEL,
    SERIES,
    ServeSettings,
    batching_repo,
    serve_cmd,
)
from scalelab.diagnose.stages.serve_curve import capacity_slo, grid_bounds
from scalelab.diagnose.stages.serve_meter import WARMUP_S, ServerMeter
from scalelab.diagnose.stages.serve_search import run_search
from scalelab.diagnose.stages.serve_sweep import Shape, run_sweep, sweep_shapes
from scalelab.diagnose.stages.sized_load import sized_levels
from scalelab.diagnose.stages.train import FEATURES, SERVED_MODEL
from scalelab.diagnose.steps import Step, restage
from scalelab.web import trace as web_trace
from scalelab.web.spawn import start_server, stop_group

__all__ = ["CAPACITY_SEARCH_S", "STAGE", "ServeSettings", "ServeStage", "advise"]

TRACE_SAMPLE = 0.05
"""Share of the highest level's requests the load generator sends with a sampled traceparent;
the batching servers follow them into OUT/traces/serve-batching-<setting>.jsonl, which the
report attributes (its p99 lines)."""
TRACES = "traces"
RECOVERY_UNKNOWN = "none known (the endpoint's own is not visible to the load test)"
CAPACITY_SEARCH_S = 22.0
"""One capacity search of a user's endpoint (`stages.serve.url`, custom `load` stages): the
2-core reference run, 22 s each."""


def _measured(r: Record, *, meter: ServerMeter, repeat: int) -> Record:
    return meter.tag(restage(r, stage="serve", repeat=repeat))


def _user_endpoint(r: Record, *, note: str | None = None) -> Record:
    return noted(restage(r, stage="serve").model_copy(update={"recovery": RECOVERY_UNKNOWN}),
                 note=note)


def searched_settings(s: ServeSettings, cores: int) -> list[str]:
    """The batching settings whose one server gets its own capacity search (pure): each one
    but the replicated setting when the replica sweep measures that very server (1 process
    with as many torch threads as cores, the server's default), which it does in its
    'threads=N' (or, on 1 core, 'replicas=1') search."""
    if not (s.capacity and capacity_slo(s.built_objectives())):
        return []
    default = Shape(processes=1, threads=cores)
    covered = default in sweep_shapes(s, cores)
    return [b for b in s.batching if not (covered and b == s.replicas_batching)]


STEP_START_S = 1.5
"""A load step's process start-up and teardown beside its warm-up and window: a 2 s level
chunk (1 s warm-up) took 4.5 s a step in the quiet demo of 2026-12-03 11:39 UTC (2 cores)."""
SERVER_START_S = 3.0
"""One server start until it answers ready (quiet demo of 2026-12-03: 2–4 s each)."""
SEARCH_S = 12.0
"""One capacity search started at its server's highest passing level (its process start and
about six short steps; measured below in docs/diagnose.md)."""
SWEEP_SHAPE_S = 14.0
"""One replica-sweep shape: its server's start (every worker) and its capacity search."""


class ServeStage(Stage[ServeSettings]):
    name = "serve"
    settings = ServeSettings
    sized = True

    def needs(self, s: ServeSettings) -> tuple[Artifact, ...]:
        return () if s.url else (FEATURES, SERVED_MODEL)

    def count(self, s: ServeSettings, repeats: int) -> int:
        searching = 1 if s.capacity and capacity_slo(s.built_objectives()) else 0
        if s.url:
            return len(s.levels) + searching  # one chunk a level at least
        cores = os.cpu_count() or 1
        sweep = searching * len(sweep_shapes(s, cores))
        return (len(s.batching) * repeats * len(s.levels) + len(searched_settings(s, cores))
                + sweep)

    def _load(
        self, s: ServeSettings, url: str, rec: Path, rates: list[float],
        repo: Path | None = None, data: Path | None = None, trace_sample: float | None = None,
    ) -> LoadRun:
        flights = repo is not None
        return LoadRun(url=url, rates=rates, duration=s.duration, warmup=f"{WARMUP_S:g}s",
                       records=rec, payload="flights" if flights else None,
                       model=MODEL if flights else None, model_repo=repo, data=data,
                       trace_sample=trace_sample)

    def run(self, s: ServeSettings, ctx: Context) -> None:
        if s.url:
            self._run_url(s, ctx, s.url)
            return
        repo, dataset = ctx.artifact(SERVED_MODEL), ctx.artifact(FEATURES)
        if repo is None:
            return
        test_rows = dataset / "test.parquet" if dataset else None
        first = parse_duration(s.duration)
        cores = os.cpu_count() or 1
        searched = searched_settings(s, cores)
        # What the stage still has to do besides its levels; each part leaves the reserve as
        # it is done, so the later levels get the time it did not take.
        clock = LevelClock(
            share_s=ctx.shares.get(self.name), levels=len(s.batching) * ctx.repeats * len(s.levels),
            cap_s=parse_duration(s.level_cap) if ctx.full else first,
            reserve_s=self._after_levels_s(s, cores))
        clock.start()  # the server starts are paid from the share too
        grid: dict[str, list[Record]] = {}
        for setting in s.batching:
            series = SERIES[setting]
            srepo = batching_repo(repo, ctx.work / f"repo-batching-{setting}",
                                  batching=setting == "on", serial_ms=s.serial_ms)
            log = ctx.logs / f"server-{srepo.name}.log"
            ctx.logs.mkdir(parents=True, exist_ok=True)
            # tracing follows only the requests the highest level's load marks (sample 0)
            spans = ctx.work.parent / TRACES / f"serve-batching-{setting}.jsonl"
            spans.unlink(missing_ok=True)
            traced = web_trace.available()
            try:
                spawned = start_server(functools.partial(
                    serve_cmd, srepo, trace_out=spans if traced else None), log=log,
                    timeout_s=90.0)
            except RunFailedError as e:
                ctx.fail(Step(stage=self.name, label=f"serve {series}", command=None), str(e))
                continue
            finally:
                clock.reserve_s = max(0.0, clock.reserve_s - SERVER_START_S)
            try:
                url = f"{spawned.url}/v2/models/{MODEL}/infer"
                for rep in range(ctx.repeats):
                    # One step per level (a chunk of it: diagnose.sizing), so the server's CPU
                    # time and responses are read before and after each: serving's cost per
                    # prediction is measured.
                    for m in s.levels:
                        chunk = functools.partial(
                            self._chunk, s, ctx, url=url, series=series, setting=setting,
                            rep=rep, m=m, pid=spawned.proc.pid, base=spawned.url, repo=repo,
                            data=test_rows, trace_sample=TRACE_SAMPLE if (
                                traced and m == max(s.levels)) else None)
                        merged = size_level(chunk, s.built_objectives(), first_s=first,
                                            share_s=clock.next_share())
                        if merged is not None:
                            ctx.keep([merged])
                            grid.setdefault(setting, []).append(merged)
                if setting in searched:
                    bounds = grid_bounds(build_sheet(grid.get(setting, [])),
                                         s.built_objectives(), s.base_rate)
                    run_search(s, ctx, stage=self.name, series=series, url=url, repo=repo,
                               data=test_rows, start=bounds.start, fails_at=bounds.fails_at)
                    clock.reserve_s = max(0.0, clock.reserve_s - SEARCH_S)
            finally:
                stop_group(spawned.proc, grace_s=5.0)
        replicated = grid.get(s.replicas_batching, [])
        run_sweep(s, ctx, repo, test_rows, stage=self.name, cores=cores,
                  grid_pass=grid_bounds(build_sheet(replicated), s.built_objectives(),
                                        s.base_rate).start if replicated else None)

    def _run_url(self, s: ServeSettings, ctx: Context, endpoint: str) -> None:
        """The user's endpoint: its levels sized, then the capacity search."""
        rec = ctx.records("serve")
        rates = [s.base_rate * m for m in s.levels]
        note = metrics_note(metrics_url(endpoint))
        searching = s.capacity and capacity_slo(s.built_objectives()) is not None
        ok = sized_levels(ctx, budget_key=self.name, stage=self.name, label=f"load {endpoint}",
                          cmd=self._load(s, endpoint, rec, rates),
                          objectives=s.built_objectives(), series=SERIES[s.baseline],
                          tag=functools.partial(_user_endpoint, note=note), rec=rec,
                          reserve_s=CAPACITY_SEARCH_S if searching else 0.0)
        # The user's endpoint gets the reference server's capacity search too: where it
        # stops meeting the objective, which the replica advice divides the peak by
        # (not after a failed sweep: an endpoint that did not answer has no capacity).
        if ok:
            run_search(s, ctx, stage=self.name, series=SERIES[s.baseline], url=endpoint,
                       repo=None, data=None, tag=functools.partial(_user_endpoint, note=note),
                       start=grid_start(rec, s.built_objectives(), s.base_rate))

    def _chunk(self, s: ServeSettings, ctx: Context, seconds: float, index: int, *, url: str,
               series: str, setting: str, rep: int, m: float, pid: int, base: str,
               repo: Path, data: Path | None, trace_sample: float | None) -> Record | None:
        """One chunk of a level: a load step of `seconds` measured, metered on the server."""
        rec = ctx.records(f"serve-{setting}-{rep}-{m:g}-{index}")
        cmd = replace(self._load(s, url, rec, [s.base_rate * m], repo=repo, data=data,
                                 trace_sample=trace_sample if index == 0 else None),
                      duration=f"{seconds:.3g}s")
        meter = ServerMeter(pid=pid, url=base, core_hour_usd=ctx.prices.core_hour_usd,
                            duration_s=seconds)
        meter.start()
        more = f" +{index}" if index else ""
        res = ctx.run(
            Step(stage=self.name, label=f"serve {series} {m:g}× #{rep + 1}{more}",
                 command=cmd, records=rec, series=series,
                 tag=functools.partial(_measured, meter=meter, repeat=rep), timeout_s=600,
                 keep=False))
        return res.records[0] if res.records else None

    def _after_levels_s(self, s: ServeSettings, cores: int) -> float:
        """Seconds of the stage's fixed work besides its levels' chunks: server starts, the
        capacity searches and the replica sweep (measured, see the constants)."""
        searching = 1 if s.capacity and capacity_slo(s.built_objectives()) else 0
        shapes = len(sweep_shapes(s, cores)) if searching else 0
        return (SERVER_START_S * len(s.batching) + SEARCH_S * len(searched_settings(s, cores))
                + SWEEP_SHAPE_S * shapes)

    def minimum_s(self, s: ServeSettings, repeats: int) -> float:
        chunk_s = parse_duration(s.duration) + WARMUP_S + STEP_START_S
        if s.url:
            return len(s.levels) * chunk_s + CAPACITY_SEARCH_S
        steps = len(s.batching) * repeats * len(s.levels)
        return steps * chunk_s + self._after_levels_s(s, os.cpu_count() or 1)

    def goals(self, s: ServeSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(),
                      baseline_series=SERIES[s.baseline], target_multiple=s.target_multiple,
                      advisor=advise)
        ]


STAGE = ServeStage()

