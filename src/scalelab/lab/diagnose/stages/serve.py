"""The serving stage: the model server under growing arrival rate, dynamic batching off and on,
and a replica sweep (N processes × 1 thread against 1 process × N threads, capacity searches).

Each batching setting gets its own copy of the trained model's repository (its serving config
rewritten through serve's own config model, `serve_config`) and its own server process on a
free loopback port; the sweep's shapes one each too. Every server starts at once, before the
first level (`serve_servers`: the starts overlap on the cores, and none shares the CPU with a
measurement). Per server and repeat, one `load run` step offers every level's first chunk in
turn, metered per level on the server by the step itself (`--server-pid`, `serve_meter`); a
level still undecided then gets more chunks, each its own step (`diagnose.sizing`). With
`capacity`, the server is then searched for the highest rate meeting the objectives, starting
at its highest level decided to meet them and bisecting below its lowest level decided to miss
(`serve_search`); the replica sweep (`serve_sweep`) searches each shape's server, so "N
replicas hold X requests/s" is a measurement, and the advice (`serve_advice`) reads the
searches. A setting's one-server search is skipped where the sweep measures that very server
(on N cores, 1 process × N threads of the replicated setting). With `url`, the user's endpoint
is loaded instead and nothing is started.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from scalelab.lab.core.objectives import Objective, slo_text
from scalelab.lab.core.records import Record, read_records
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.units import parse_duration
from scalelab.lab.core.verdict import StageGoal
from scalelab.lab.diagnose.commands import LoadRun
from scalelab.lab.diagnose.sizing import (
    Chunk,
    LevelClock,
    Outcome,
    curve_point,
    decide_target,
    level_outcome,
    search_decides,
    size_level,
    target_level,
)
from scalelab.lab.diagnose.stages.base import Artifact, Context, Stage
from scalelab.lab.diagnose.stages.endpoint import (
    grid_start,
    metrics_note,
    metrics_url,
    noted,
    sized_by,
)
from scalelab.lab.diagnose.stages.serve_advice import advise
from scalelab.lab.diagnose.stages.serve_config import (
    MODEL,
    SERIES,
    ServeSettings,
    batching_repo,
    serve_cmd,
)
from scalelab.lab.diagnose.stages.serve_curve import CAPACITY, grid_bounds
from scalelab.lab.diagnose.stages.serve_meter import WARMUP_S, metered, tree_usage
from scalelab.lab.diagnose.stages.serve_search import SEARCH_CONFIRM_S, run_search, search_path
from scalelab.lab.diagnose.stages.serve_servers import Planned, start_all, stop_all
from scalelab.lab.diagnose.stages.serve_sweep import Shape, run_sweep, sweep_servers, sweep_shapes
from scalelab.lab.diagnose.stages.sized_load import sized_levels
from scalelab.lab.diagnose.stages.train import FEATURES, SERVED_MODEL
from scalelab.lab.diagnose.steps import Step, restage
from scalelab.layers.web import trace as web_trace
from scalelab.layers.web.spawn import Spawned

__all__ = ["CAPACITY_SEARCH_S", "STAGE", "ServeSettings", "ServeStage", "advise"]

TRACE_SAMPLE = 0.05
"""Share of the highest level's requests the load generator sends with a sampled traceparent;
the batching servers follow them into OUT/traces/serve-batching-<setting>.jsonl, which the
report attributes (its p99 lines)."""
TRACES = "traces"
RECOVERY_UNKNOWN = "none known (the endpoint's own is not visible to the load test)"
CAPACITY_SEARCH_S = 33.0
"""One capacity search of a user's endpoint (`stages.serve.url`, custom `load` stages): the
2-core reference run, 22 s each, plus its 10 s confirmation run (`serve_search.SEARCH_CONFIRM`)
and the warm-up before it."""


def _measured(r: Record, *, url: str, usd: float, repeat: int) -> Record:
    return metered(restage(r, stage="serve", repeat=repeat), url=url, core_hour_usd=usd)


def by_rate(records: list[Record], rates: list[float]) -> dict[float, Record]:
    """A step's records (one a level, in the order of `rates`; a failed step's stop short) by
    the rate each offered (pure)."""
    return {rate: r for rate, r in zip(rates, records, strict=False)
            if math.isclose(r.level, rate, rel_tol=1e-9)}


@dataclass(frozen=True, kw_only=True)
class FirstChunks:
    """The step over every level of a server: its records by rate, and how long it took."""

    records: dict[float, Record]
    took_s: float


@dataclass(kw_only=True)
class Lent:
    """The clock a level's sizing reads (`size_level(clock=)`): the monotonic clock, plus the
    level's part of the step that measured its first chunk, added when that chunk is handed
    over, so the level's spent seconds and its chunks' overhead count it as if the chunk
    had been its own step."""

    per_level_s: float
    base: Callable[[], float] = time.monotonic
    offset_s: float = 0.0

    def lend(self) -> None:
        self.offset_s += self.per_level_s

    def clock(self) -> float:
        return self.base() + self.offset_s


SWEEP_PAID = 0.8
"""The replica sweep runs when the stage's share has left at least this part of what its
searches are expected to take (they stop early when a rate fails; advice, not a decision)."""
ASSUMPTION = ("latency and failures do not fall as load rises: a rate that meets the objectives "
              "at a higher arrival rate meets them at the target's")


SEARCH_BUSY_KEY = "search_server_busy_cores"
"""Record extra: the server tree's CPU seconds over the capacity search's wall time."""


@dataclass(frozen=True, kw_only=True)
class SearchUsage:
    """The server's process tree read around its capacity search (`load capacity` does not
    meter the server): its mean busy cores over the search's wall time, its start-up and
    lower-rate steps included, so a lower bound on the cores busy at the rate that decided."""

    busy_cores: float


def searched_usage(pid: int, search: Callable[[], None]) -> SearchUsage | None:
    """Run `search`, reading the server tree's CPU seconds before and after it; None when
    the server could not be read."""
    cpu0, _ = tree_usage(pid)
    t0 = time.monotonic()
    search()
    took = time.monotonic() - t0
    cpu1, rss = tree_usage(pid)
    if took <= 0 or not rss or cpu1 < cpu0:
        return None
    return SearchUsage(busy_cores=(cpu1 - cpu0) / took)


def searched_decision(ctx: Context, series: str, objectives: list[Objective], target_rps: float,
                      first: FirstChunks, *, rep: int,
                      usage: SearchUsage | None = None) -> Record | None:
    """The baseline's target decided by its capacity search: the search's lowest step at or
    above the target's rate that met every objective (`sizing.search_decides`), as a decision
    record of the baseline series at the rate it measured, saying so and what it assumes,
    with the server's busy cores read around the search (`usage`: the limit the verdict
    infers from the row); None when no step decides it."""
    path = search_path(ctx, series)
    step = search_decides(read_records(path) if path.is_file() else [], objectives, target_rps)
    if step is None:
        return None
    like = next(iter(first.records.values()), None)
    r = restage(step, stage="serve", repeat=rep)
    if usage is not None:
        r = r.model_copy(update={
            "resources": r.resources.model_copy(update={
                "cpu_busy_cores": usage.busy_cores}),
            "extras": {**r.extras, SEARCH_BUSY_KEY: round(usage.busy_cores, 3)}})
    return r.model_copy(update={
        "experiment": like.experiment if like is not None else r.experiment,
        # the baseline's variable: a confirmation's own ("rate (confirmation)") would make
        # the row a series of its own, its one level read as 1×
        "variable": like.variable if like is not None else "rate",
        "purpose": "decision", "series": series,
        "extras": {**r.extras, "decided_by": {
            "search": series + CAPACITY, "rate": step.level, "target_rate": target_rps,
            "steps": step.extras.get("merged_steps", [step.level]),
            "assumption": ASSUMPTION}}})


def _user_endpoint(r: Record, *, note: str | None = None) -> Record:
    return noted(restage(r, stage="serve").model_copy(update={"recovery": RECOVERY_UNKNOWN}),
                 note=note)


def searched_settings(s: ServeSettings, cores: int) -> list[str]:
    """The batching settings whose one server gets its own capacity search (pure): each one
    but the replicated setting when the replica sweep measures that very server (1 process
    with as many torch threads as cores, the server's default), which it does in its
    'threads=N' (or, on 1 core, 'replicas=1') search."""
    if not (s.capacity and slo_text(s.built_objectives())):
        return []
    default = Shape(processes=1, threads=cores)
    covered = default in sweep_shapes(s, cores)
    return [b for b in s.batching if not (covered and b == s.replicas_batching)]


STEP_START_S = 1.5
"""A load step's process start-up and teardown beside its levels' warm-ups and windows: a 2 s
level chunk (1 s warm-up) took 4.5 s a step in the quiet demo of 2026-12-03 11:39 UTC; the step
over four such levels took 13.3 s (12 s of warm-ups and windows) at load 4.5 on the shared
2-core VM, 2026-12-03 14:59 UTC (docs/diagnose-stages.md). A level adds nothing measurable beside
its own warm-up and window."""
SERVER_START_S = 3.0
"""One server process's start until it answers ready, about one core's work (quiet demo of
2026-12-03: 2–4 s each); starts overlap up to the cores (`servers_start_s`)."""
SEARCH_S = 17.0
"""One capacity search started at its server's highest passing level: batching=off's took
20 s (7 steps, 400 to 5,600 requests/s) in the quiet demo of 2026-12-03 14:40 UTC, less 0.4 s
a step since the stopping rule is asked every 0.1 s (`load.driver.STOP_CHECK_S`: steps at the
1 s floor measure 1.05 s, not 1.46 s)."""
SWEEP_SEARCH_S = 12.0
"""One replica-sweep shape's capacity search, its server started with the others: 22, 10 and
8 s (replicas=1, replicas=2, threads=2; 6, 3 and 2 steps) in the same quiet demo, less 0.4 s a
step."""


def size_rate(chunk: Chunk, objectives: list[Objective], *, first_s: float, share_s: float,
              clock: Callable[[], float]) -> Record | None:
    """One rate of the baseline's server sized to a decision (`sizing.size_level`, paid_only):
    a later chunk sends the largest count of requests its undecided checks need that the
    share pays at the rate measured (a p99's 299 at 40/s), and the level stops, handing the
    time on, when the share pays none (99.9% availability's 2,995) rather than spending it
    on a count it cannot reach. A chunk costs its step's start and warm-up beside its window."""
    return size_level(chunk, objectives, first_s=first_s, share_s=share_s, clock=clock,
                      overhead_s=STEP_START_S + WARMUP_S, paid_only=True)


def servers_start_s(processes: int, cores: int) -> float:
    """Seconds until `processes` server processes started at once all answer (pure): each
    start is about one core's `SERVER_START_S`, so they overlap up to `cores`."""
    if processes <= 0:
        return 0.0
    return SERVER_START_S * processes / min(max(1, cores), processes)


class ServeStage(Stage[ServeSettings]):
    name = "serve"
    settings = ServeSettings
    sized = True

    def needs(self, s: ServeSettings) -> tuple[Artifact, ...]:
        return () if s.url else (FEATURES, SERVED_MODEL)

    def count(self, s: ServeSettings, repeats: int) -> int:
        searching = 1 if s.capacity and slo_text(s.built_objectives()) else 0
        if s.url:
            return len(s.levels) + searching  # one chunk a level at least
        cores = os.cpu_count() or 1
        sweep = searching * len(sweep_shapes(s, cores))
        # one step over every level per setting and repeat (more chunks are not counted ahead)
        return len(s.batching) * repeats + len(searched_settings(s, cores)) + sweep

    def _load(
        self, s: ServeSettings, url: str, rec: Path, rates: list[float],
        repo: Path | None = None, data: Path | None = None, trace_sample: float | None = None,
    ) -> LoadRun:
        flights = repo is not None
        return LoadRun(url=url, rates=rates, duration=s.duration, arrival="constant",
                       warmup=f"{WARMUP_S:g}s",
                       records=rec, payload="flights" if flights else None,
                       model=MODEL if flights else None, model_repo=repo, data=data,
                       trace_sample=trace_sample, **s.access())

    def run(self, s: ServeSettings, ctx: Context) -> None:
        if s.url:
            self._run_url(s, ctx, s.url)
            return
        repo, dataset = ctx.artifact(SERVED_MODEL), ctx.artifact(FEATURES)
        if repo is None:
            return
        test_rows = dataset / "test.parquet" if dataset else None
        cores = os.cpu_count() or 1
        if self.name in ctx.short and (len(s.batching) > 1 or s.replicas):
            # The share cannot pay the fixed work: only what the target's decision needs.
            ctx.note(f"serve: its {ctx.shares.get(self.name, 0.0):.0f} s share was under its "
                     "minimum at this run's pace: cut to the baseline's levels and search (no "
                     "other batching setting, no replica sweep); a larger --budget runs them")
            s = s.model_copy(update={"batching": [s.baseline], "replicas": []})
        # What the stage still has to do besides its decisions; each part leaves the reserve
        # as it is done, so the decided levels get the time it did not take.
        clock = LevelClock(
            share_s=ctx.shares.get(self.name), levels=1,
            cap_s=parse_duration(s.level_cap) if ctx.full else parse_duration(s.duration),
            reserve_s=self._after_levels_s(s, cores))
        clock.start()  # the server starts are paid from the share too
        traced = web_trace.available()
        planned = [self._batching_server(s, ctx, repo, setting, traced=traced)
                   for setting in s.batching]
        planned += sweep_servers(s, ctx, repo, cores=cores)
        if ctx.unpaid_start(self.name, f"starting its {len(planned)} server(s)",
                            self.start_s(s, planned, cores)):
            return
        servers = start_all(planned)
        try:
            self._settings(s, ctx, clock, servers, repo=repo, data=test_rows, traced=traced,
                           cores=cores)
        finally:
            stop_all(servers)

    def _settings(self, s: ServeSettings, ctx: Context, clock: LevelClock,
                  servers: dict[str, Spawned | str], *, repo: Path, data: Path | None,
                  traced: bool, cores: int) -> None:
        """Every batching setting's levels once each (curve points, one step a setting and
        repeat), its capacity search, then the baseline's target decided (by its search's
        step at or above the target's rate, else sized, and a bisection for its first miss
        when missed), then the replica sweep while the share can pay for it."""
        searched = searched_settings(s, cores)
        firsts: dict[str, list[FirstChunks]] = {}
        urls: dict[str, Spawned] = {}
        for setting in s.batching:
            spawned = servers[SERIES[setting]]
            if not isinstance(spawned, Spawned):
                ctx.fail(Step(stage=self.name, label=f"serve {SERIES[setting]}", command=None),
                         spawned)
                continue
            urls[setting] = spawned
            firsts[setting] = [
                self._first_chunks(s, ctx, spawned, url=f"{spawned.url}/v2/models/{MODEL}/infer",
                                   series=SERIES[setting], setting=setting, rep=rep, repo=repo,
                                   data=data, traced=traced)
                for rep in range(ctx.repeats)]
        searched_s: list[float] = []
        usage: dict[str, SearchUsage | None] = {}
        for setting in [x for x in s.batching if x in searched and x in urls]:
            bounds = grid_bounds(build_sheet(list(firsts[setting][0].records.values())),
                                 s.built_objectives(), s.base_rate)
            t0 = time.monotonic()
            usage[setting] = searched_usage(urls[setting].proc.pid, functools.partial(
                run_search, s, ctx, stage=self.name, series=SERIES[setting],
                url=f"{urls[setting].url}/v2/models/{MODEL}/infer", repo=repo,
                data=data, start=bounds.start, fails_at=bounds.fails_at))
            searched_s.append(time.monotonic() - t0)
        clock.reserve_s = self._sweep_s(s, cores, searched_s)
        grid: dict[str, list[Record]] = {}
        for name, reps in firsts.items():
            grid[name] = []
            for rep, first in enumerate(reps):
                if name == s.baseline:
                    got = self._decide(s, ctx, clock, urls[name], first, setting=name,
                                       rep=rep, repo=repo, data=data, traced=traced,
                                       usage=usage.get(name))
                else:
                    got = [curve_point(r) for r in first.records.values()]
                ctx.keep(got)
                grid[name] += got
        replicated = grid.get(s.replicas_batching, [])
        if clock.reserve_s and clock.left_s() + clock.reserve_s < clock.reserve_s * SWEEP_PAID:
            ctx.note(f"serve: replica sweep not run: {clock.left_s() + clock.reserve_s:.0f} s "
                     f"of the stage's share left, its searches need ~{clock.reserve_s:.0f} s "
                     "(scaled from this run's own search); a larger --budget runs it")
            return
        run_sweep(s, ctx, repo, data, stage=self.name, cores=cores, servers=servers,
                  grid_pass=grid_bounds(build_sheet(replicated), s.built_objectives(),
                                        s.base_rate).start if replicated else None)

    def _sweep_s(self, s: ServeSettings, cores: int, searched_s: list[float]) -> float:
        """Seconds the replica sweep's searches will take: `SWEEP_SEARCH_S` a shape, scaled
        by how this run's own one-server searches went against `SEARCH_S` (the machine's
        pace, measured), never under the estimate."""
        searching = s.capacity and slo_text(s.built_objectives()) is not None
        shapes = len(sweep_shapes(s, cores)) if searching else 0
        pace = max(1.0, sum(searched_s) / (SEARCH_S * len(searched_s))) if searched_s else 1.0
        return SWEEP_SEARCH_S * shapes * pace

    def _decide(self, s: ServeSettings, ctx: Context, clock: LevelClock, spawned: Spawned,
                first: FirstChunks, *, setting: str, rep: int, repo: Path, data: Path | None,
                traced: bool, usage: SearchUsage | None = None) -> list[Record]:
        """The baseline server's levels for one repeat: its target decided first, by the
        capacity search's step at or above the target's rate when one met every objective
        (repeat 1 only: the search ran once), else sized until decided; when missed, the
        first miss found by bisection (`sizing.decide_target`). Every level not decided is
        its first chunk as a curve point."""
        series = SERIES[setting]
        url = f"{spawned.url}/v2/models/{MODEL}/infer"
        objectives = s.built_objectives()
        target = s.base_rate * target_level(s.levels, s.target_multiple)
        top = s.base_rate * max(s.levels)
        if rep == 0:
            by_search = searched_decision(ctx, series, objectives, target, first, rep=rep,
                                          usage=usage)
            if by_search is not None:
                return sorted([by_search, *[curve_point(r) for rate, r in first.records.items()
                                            if not math.isclose(rate, by_search.level)]],
                              key=lambda r: r.level)
        lent = Lent(per_level_s=first.took_s / max(1, len(s.levels)))
        decided: dict[float, Record] = {}

        def outcome(m: float, probes_left: int) -> Outcome:
            rate = s.base_rate * m
            chunk = functools.partial(
                self._chunk, s, ctx, url=url, series=series, setting=setting, rep=rep, m=m,
                spawned=spawned, repo=repo, data=data,
                trace_sample=TRACE_SAMPLE if traced and rate == top else None,
                first=first.records.get(rate), lent=lent)
            level = size_rate(chunk, objectives, first_s=parse_duration(s.duration),
                              share_s=clock.left_s() / max(1, probes_left), clock=lent.clock)
            if level is None:
                return "undecided"
            decided[rate] = level
            return level_outcome(level, objectives)

        decide_target(s.levels, s.target_multiple, outcome)
        return sorted([*decided.values(), *[curve_point(r) for rate, r in first.records.items()
                                            if rate not in decided]], key=lambda r: r.level)

    def _batching_server(self, s: ServeSettings, ctx: Context, repo: Path, setting: str, *,
                         traced: bool) -> Planned:
        """The one-process server of a batching setting, on its own copy of the repository;
        with tracing, it follows the requests the highest level's load marks into
        OUT/traces/serve-batching-<setting>.jsonl."""
        srepo = batching_repo(repo, ctx.work / f"repo-batching-{setting}",
                              batching=setting == "on", serial_ms=s.serial_ms)
        spans = ctx.work.parent / TRACES / f"serve-batching-{setting}.jsonl"
        spans.unlink(missing_ok=True)
        return Planned(key=SERIES[setting],
                       command=functools.partial(serve_cmd, srepo,
                                                 trace_out=spans if traced else None),
                       log=ctx.logs / f"server-{srepo.name}.log")

    def _first_chunks(self, s: ServeSettings, ctx: Context, spawned: Spawned, *, url: str,
                      series: str, setting: str, rep: int, repo: Path, data: Path | None,
                      traced: bool) -> FirstChunks:
        """One `load run` step over every level's rate (`stages.serve.duration` each, its 1 s
        warm-up, the server metered per level), the highest one traced; its records by rate."""
        rates = [s.base_rate * m for m in s.levels]
        rec = ctx.records(f"serve-{setting}-{rep}")
        cmd = replace(self._load(s, url, rec, rates, repo=repo, data=data,
                                 trace_sample=TRACE_SAMPLE if traced else None),
                      trace_at=max(rates) if traced else None, server_pid=spawned.proc.pid,
                      metrics_url=f"{spawned.url}/metrics")
        t0 = time.monotonic()
        res = ctx.run(Step(stage=self.name, label=f"serve {series} #{rep + 1}", command=cmd,
                           records=rec, series=series,
                           tag=functools.partial(_measured, url=spawned.url,
                                                 usd=ctx.prices.core_hour_usd, repeat=rep),
                           timeout_s=600, keep=False))
        return FirstChunks(records=by_rate(res.records, rates), took_s=time.monotonic() - t0)

    def _run_url(self, s: ServeSettings, ctx: Context, endpoint: str) -> None:
        """The user's endpoint: its levels sized, then the capacity search."""
        rec = ctx.records("serve")
        rates = [s.base_rate * m for m in s.levels]
        note = metrics_note(metrics_url(endpoint))
        searching = s.capacity and slo_text(s.built_objectives()) is not None
        ok = sized_levels(ctx, budget_key=self.name, stage=self.name, label=f"load {endpoint}",
                          cmd=dataclasses.replace(self._load(s, endpoint, rec, rates),
                                                  server_signals=True, server_pid=s.server_pid,
                                                  prometheus=ctx.prometheus),
                          objectives=sized_by(s.built_objectives()), series=SERIES[s.baseline],
                          tag=functools.partial(_user_endpoint, note=note), rec=rec,
                          reserve_s=CAPACITY_SEARCH_S if searching else 0.0, paid_only=True)
        # The user's endpoint gets the reference server's capacity search too: where it
        # stops meeting the objective, which the replica advice divides the peak by
        # (not after a failed sweep: an endpoint that did not answer has no capacity).
        if ok:
            run_search(s, ctx, stage=self.name, series=SERIES[s.baseline], url=endpoint,
                       repo=None, data=None, tag=functools.partial(_user_endpoint, note=note),
                       start=grid_start(rec, s.built_objectives(), s.base_rate))

    def _chunk(self, s: ServeSettings, ctx: Context, seconds: float, index: int, *, url: str,
               series: str, setting: str, rep: int, m: float, spawned: Spawned, repo: Path,
               data: Path | None, trace_sample: float | None, first: Record | None,
               lent: Lent) -> Record | None:
        """One chunk of a level: its first one from the step over every level (`first`);
        otherwise a `load run` step of `seconds` measured at the level's rate, metered on the
        server (also a first chunk the step over every level did not record)."""
        if index == 0 and first is not None:
            lent.lend()
            return first
        rec = ctx.records(f"serve-{setting}-{rep}-{m:g}-{index}")
        cmd = replace(self._load(s, url, rec, [s.base_rate * m], repo=repo, data=data,
                                 trace_sample=trace_sample if index == 0 else None),
                      duration=f"{seconds:.3g}s", server_pid=spawned.proc.pid,
                      metrics_url=f"{spawned.url}/metrics")
        more = f" +{index}" if index else ""
        res = ctx.run(
            Step(stage=self.name, label=f"serve {series} {m:g}× #{rep + 1}{more}",
                 command=cmd, records=rec, series=series,
                 tag=functools.partial(_measured, url=spawned.url,
                                       usd=ctx.prices.core_hour_usd, repeat=rep),
                 timeout_s=600, keep=False))
        return res.records[0] if res.records else None

    def start_s(self, s: ServeSettings, planned: list[Planned], cores: int) -> float:
        """Quiet seconds before its first decision: the planned servers' start (a multi-worker
        server is its master and its workers, each an interpreter's start) and its first
        step over the levels, the target's among them (pure)."""
        processes = sum(p.workers + (p.workers > 1) for p in planned)
        level_s = parse_duration(s.duration) + WARMUP_S
        return servers_start_s(processes, cores) + STEP_START_S + len(s.levels) * level_s

    def _after_levels_s(self, s: ServeSettings, cores: int) -> float:
        """Seconds of the stage's fixed work after its levels: the capacity searches and the
        replica sweep's (measured, see the constants)."""
        searching = 1 if s.capacity and slo_text(s.built_objectives()) else 0
        shapes = len(sweep_shapes(s, cores)) if searching else 0
        return SEARCH_S * len(searched_settings(s, cores)) + SWEEP_SEARCH_S * shapes

    def minimum_s(self, s: ServeSettings, repeats: int) -> float:
        level_s = parse_duration(s.duration) + WARMUP_S
        if s.url:
            return len(s.levels) * (level_s + STEP_START_S) + CAPACITY_SEARCH_S
        cores = os.cpu_count() or 1
        searching = s.capacity and slo_text(s.built_objectives()) is not None
        # a multi-worker server is its master and its workers, each an interpreter's start
        processes = len(s.batching) + (sum(x.processes + (x.processes > 1)
                                           for x in sweep_shapes(s, cores)) if searching else 0)
        first_steps = len(s.batching) * repeats
        return (servers_start_s(processes, cores)
                + first_steps * (STEP_START_S + len(s.levels) * level_s)
                + self._after_levels_s(s, cores))

    def least_s(self, s: ServeSettings, repeats: int) -> float:
        """What its decision needs: the baseline's server, its levels and one capacity search
        with its confirmation; the other batching settings and the replica sweep are advice,
        which the stage cuts when its share is short."""
        if s.url:
            return self.minimum_s(s, repeats)
        cores = os.cpu_count() or 1
        level_s = parse_duration(s.duration) + WARMUP_S
        searching = s.capacity and slo_text(s.built_objectives()) is not None
        return (servers_start_s(1, cores) + repeats * (STEP_START_S + len(s.levels) * level_s)
                + ((SEARCH_S + SEARCH_CONFIRM_S) if searching else 0.0))

    def goals(self, s: ServeSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(),
                      baseline_series=SERIES[s.baseline], target_multiple=s.target_multiple,
                      advisor=advise)
        ]


STAGE = ServeStage()

