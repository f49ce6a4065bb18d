"""The serving stage: the model server under growing arrival rate, dynamic batching off and on,
and a replica sweep (N processes × 1 thread against 1 process × N threads, capacity searches).

Each batching setting gets its own copy of the trained model's repository (its serving config
rewritten through serve's own config model) and its own server process on a free loopback
port; the load generator runs as a separate step per repeat. With `capacity`, each setting's
server is then searched for the highest rate meeting the objectives, and the replica sweep
starts one server per shape (uvicorn workers behind the one port, `--torch-threads`), waits
until every worker has started, and searches each, so "N replicas hold X requests/s" is a
measurement (`serve_curve` reads the searches). With `url`, the user's endpoint is loaded
instead and nothing is started.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import psutil
from pydantic import Field

from scalelab.core.errors import RunFailedError
from scalelab.core.knee import find_knee
from scalelab.core.peak_memory import TreeSampler
from scalelab.core.records import Cost, Record, read_records
from scalelab.core.sheet import SheetRow
from scalelab.core.units import parse_duration
from scalelab.core.verdict import Advice, AdviceInput, StageGoal, capacity, num_text
from scalelab.diagnose.commands import LoadCapacity, LoadRun, ServeRun
from scalelab.diagnose.scaling_signal import choose_signal
from scalelab.diagnose.schema import Duration, HttpUrl, Levels, StageSettings
from scalelab.diagnose.sizing import LevelClock, size_level
from scalelab.diagnose.stages.base import Artifact, Context, Stage
from scalelab.diagnose.stages.endpoint import (
    grid_start,
    metrics_note,
    metrics_url,
    noted,
    with_notes,
)
from scalelab.diagnose.stages.serve_curve import (
    CAPACITY,
    REPLICAS,
    THREADS,
    capacity_slo,
    replica_advice,
    search_requests,
    searches,
    step_seconds,
    sweep_points,
    sweep_start,
)
from scalelab.diagnose.stages.sized_load import sized_levels
from scalelab.diagnose.stages.train import FEATURES, SERVED_MODEL
from scalelab.diagnose.steps import Step, restage, scalelab_cmd
from scalelab.nets.registry import read_spec, write_spec
from scalelab.nets.repository import CONFIG_FILE, write_json
from scalelab.serve.config import ModelConfig, load_model_config
from scalelab.web import trace as web_trace
from scalelab.web.exposition import sample_sums
from scalelab.web.governance.middleware import server_governance
from scalelab.web.spawn import start_server, stop_group

SERIES = {"off": "batching=off", "on": "batching=on"}
TRACE_SAMPLE = 0.05
"""Share of the highest level's requests the load generator sends with a sampled traceparent;
the batching servers follow them into OUT/traces/serve-batching-<setting>.jsonl, which the
report attributes (its p99 lines)."""
TRACES = "traces"
MODEL = "flights"
BATCH_MAX = 64
"""The largest batch the batching series may form."""
BATCH_DELAY_MS = 2.0
"""How long the batcher waits for batch-mates: short against a 50 ms p95 objective."""


class ServeSettings(StageSettings):
    """`stages.serve`: open-loop arrival rates against the model server."""

    base_rate: float = Field(default=40.0, gt=0)
    """Arrival rate (requests/s) at 1×."""
    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base rate."""
    duration: Duration = "3s"
    """Measured time per level (after a 1 s warm-up)."""
    batching: list[Literal["off", "on"]] = Field(
        default_factory=lambda: ["off", "on"]  # type: ignore[arg-type]
    )
    """Batching settings to measure, each a series."""
    baseline: Literal["off", "on"] = "off"
    """Which batching setting is 'today's system'; the other is the candidate intervention."""
    url: HttpUrl | None = None
    """The user's own HTTP endpoint instead of the reference model server."""
    capacity: bool = True
    """Also search the highest rate meeting the latency objective (`scalelab load capacity`),
    per batching setting: where serving stops meeting it, not only whether 10× passes."""
    capacity_max_steps: int = Field(default=8, ge=2, le=40)
    """Bound on the capacity search's steps (each one a short load level)."""
    capacity_step: Duration = "2s"
    """Shortest "longest capacity step" (the search's --max-step, raised so the first rate can
    reach the requests the step rule needs; --min-step is half of this)."""
    capacity_availability: bool = False
    """Also judge the availability objective in every capacity step. Off by default: showing
    99.9% at 95% confidence takes 3,688 requests a step (92 s at 40 requests/s), so the search
    decides on the latency objective and availability is judged on the level sweep."""
    replicas: list[int] = Field(default_factory=lambda: [1, 2])
    """Replica counts of the replica sweep (server processes behind one port, 1 torch thread
    each), each a capacity search at the objectives (series 'replicas=N capacity'); counts
    above the machine's cores are dropped. Runs only with `capacity`; [] turns it off."""
    threads: bool = True
    """Also the vertical series: one process with T torch threads for each count T > 1 of
    `replicas` (series 'threads=T capacity'), on the same cores as T replicas."""
    level_cap: Duration = "60s"
    """With --full (no budget), the most a sized level may run while its objectives are still
    undecided (availability ≥ 99.9% alone needs 2,995 requests: 75 s at 40 requests/s)."""
    replicas_batching: Literal["off", "on"] = "on"
    """The batching setting the replica sweep replicates."""
    serial_ms: float = Field(default=0.0, ge=0, le=10_000)
    """An artificial serial section added to every forward call of the served model (the
    "delay_mlp" architecture): throttles serving on purpose, to rehearse the verdict."""


def batching_repo(src: Path, dst: Path, *, batching: bool, serial_ms: float = 0.0) -> Path:
    """A copy of a model repository whose models batch dynamically or not (and, with
    `serial_ms`, whose flights model sleeps that long per forward call)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for cfg_path in dst.glob(f"*/{CONFIG_FILE}"):
        cfg = load_model_config(cfg_path.parent)
        if batching:
            delay = cfg.dynamic_batching.model_copy(update={"max_queue_delay_ms": BATCH_DELAY_MS})
            new = {"max_batch_size": max(cfg.max_batch_size, BATCH_MAX), "dynamic_batching": delay}
        else:
            new = {"max_batch_size": 1}
        cfg = ModelConfig.model_validate({**cfg.model_dump(), **new})
        write_json(cfg_path, cfg.model_dump(mode="json", exclude_none=True))
    if serial_ms > 0:
        for spec_dir in (p.parent for p in dst.glob("*/[0-9]*/model.json")):
            spec = read_spec(spec_dir)
            if spec["architecture"] == "tabular_mlp":
                extra = {k: v for k, v in spec.items() if k not in ("architecture", "params")}
                params = {**spec["params"], "batch_ms": serial_ms, "row_ms": 0.0}
                write_spec(spec_dir, arch="delay_mlp", params=params, extra=extra)
    return dst


RECOVERY_REFERENCE = "none (one server process: no replica, no restart)"
RECOVERY_UNKNOWN = "none known (the endpoint's own is not visible to the load test)"
WARMUP_S = 1.0
"""Unmeasured warm-up per level: load is offered for WARMUP_S + duration."""


def tree_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds user + system, resident bytes) of a live process and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0
    cpu, rss = 0.0, 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            cpu += t.user + t.system
            rss += p.memory_info().rss
    return cpu, rss


def served_responses(base_url: str) -> float | None:
    """The server's own count of inference responses (its Prometheus counter), or None."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    # A labelled counter appears only after its first response: absent means 0 so far.
    return sample_sums(text, f"{base_url}/metrics").get("scalelab_responses_total", 0.0)


@dataclass(kw_only=True)
class ServerMeter:
    """The server's CPU time and responses across one load step, attached to its record:
    busy cores while load was offered, the cost of 1,000 predictions at the core price, and
    the server process tree's peak resident memory (sampled while the level ran)."""

    pid: int
    url: str
    core_hour_usd: float
    duration_s: float
    _cpu0: float = 0.0
    _rss0: int = 0
    _n0: float | None = None
    _peak: TreeSampler | None = None

    def start(self) -> None:
        (self._cpu0, self._rss0), self._n0 = tree_usage(self.pid), served_responses(self.url)
        self._peak = TreeSampler(self.pid, period_s=0.05).start()

    def tag(self, r: Record) -> Record:
        cpu1, rss1 = tree_usage(self.pid)
        peak = self._peak.stop() if self._peak is not None else 0
        cpu = cpu1 - self._cpu0
        n1 = served_responses(self.url)
        served = n1 - self._n0 if n1 is not None and self._n0 is not None else None
        offered_s = (r.wall_s or self.duration_s) + WARMUP_S
        extras = {**r.extras, "server_cpu_s": cpu, "cpu_busy_cores": cpu / offered_s}
        gov = server_governance(self.url)  # the sheet's governance cell, as the server says
        if gov is not None:
            extras["governance"] = gov
        update: dict[str, object] = {"extras": extras, "recovery": RECOVERY_REFERENCE,
                                     "peak_memory_bytes": max(self._rss0, rss1, peak) or None}
        if served:
            usd = cpu / 3600.0 * self.core_hour_usd
            extras["server_responses"] = served
            update["cost"] = Cost(usd=usd, per_unit_usd=usd / served * 1000.0,
                                  unit="1,000 predictions")
        return r.model_copy(update=update)


def measured_capacity(by_series: dict[str, list[SheetRow]]) -> list[str]:
    """From capacity-search steps (series '<setting> capacity'): the highest rate decided to
    pass, and every undecided step with its requests against the rule's."""
    return [o.text() for o in searches(by_series)]


def advise(inp: AdviceInput) -> Advice:
    """Batching and replicas from the measured capacity of each series at the objectives."""
    goal = inp.goal
    base_level = min((r.level for r in inp.base), default=0.0)
    target_level = base_level * goal.target_multiple
    caps = {s: capacity(rs, goal.objectives) for s, rs in inp.by_series.items()
            if not s.endswith(CAPACITY)}
    base_cap = caps.get(goal.baseline_series)
    best_s, best_cap = max(
        ((s, c) for s, c in caps.items() if c is not None), key=lambda t: t[1], default=(None, None)
    )
    parts: list[str] = []
    predicted: list[str] = []
    slo = ", ".join(o.label for o in goal.objectives)
    if best_s is not None and best_s != goal.baseline_series and best_cap is not None:
        parts.append(f"use {best_s}")
        predicted.append(
            f"{best_s} raises capacity at {slo} from "
            f"{num_text(base_cap)} to {best_cap:g} requests/s (measured)"
        )
    cap = best_cap if best_cap is not None else base_cap
    # The search's decided capacity, where the series has one, is what a replica holds: the
    # grid's highest passing level is only a lower bound (5 replicas where 3 hold).
    searched = {o.setting: o.capacity_rps for o in searches(inp.by_series)}
    cap_series = best_s or goal.baseline_series
    if searched.get(cap_series):
        cap = searched[cap_series]
    sweep = replica_advice(sweep_points(inp.by_series, REPLICAS),
                           sweep_points(inp.by_series, THREADS), target_level,
                           config=replicated(inp.by_series))
    if sweep is not None and sweep.replicas is not None:
        parts.append(f"run {sweep.replicas} replica(s)"
                     + ("" if sweep.measured else " (read off the replica curve: extrapolated)"))
    elif cap:
        replicas = math.ceil(target_level / cap)
        parts.append(f"run {replicas} replica(s)")
        predicted.append(
            f"{replicas} replica(s) of {best_s or 'this configuration'} hold the "
            f"{goal.target_multiple:g}× peak of {target_level:g} requests/s at "
            f"{cap:.4g} requests/s each ("
            + ("its capacity search's, " if searched.get(cap_series) else
               "the highest level measured to pass, ")
            + "linear in replicas from one replica, not measured"
            + (": stages.serve.replicas measures the curve" if sweep is None else
               ", each on cores of its own: the co-located sweep did not reach the peak") + ")"
        )
    if sweep is not None:
        predicted += sweep.lines
    if cap or (sweep is not None and sweep.replicas is not None):
        # One replica's levels of the configuration advised, replayed: which signal to scale on.
        rows = inp.by_series.get(cap_series) or inp.base
        parts.append(choose_signal(rows, goal.objectives, target_multiple=goal.target_multiple,
                                   candidates=("queue", "cpu")).text)
    elif inp.base:
        parts.append(
            "reduce per-request compute (batching, a smaller model) before adding "
            "replicas: even the lowest measured rate misses the objective"
        )
    knee = throughput_knee(inp.base)
    if knee:
        predicted.append(knee)
    predicted += measured_capacity(inp.by_series)
    return with_notes(Advice(intervention="; ".join(parts), predicted="; ".join(predicted)),
                      [r for rows in inp.by_series.values() for r in rows])


def replicated(by_series: dict[str, list[SheetRow]]) -> str:
    """The configuration the replica sweep replicated (its records say), e.g. 'batching=on'."""
    for name, rows in by_series.items():
        if name.startswith(REPLICAS):
            for r in rows:
                if r.extras.get("replicated"):
                    return str(r.extras["replicated"])
    return "the server"


KEPT_UP = 0.95
"""A level whose served rate is at least this share of its offered rate kept up with it."""


def throughput_knee(rows: list[SheetRow]) -> str:
    """Where the served rate stops following the offered rate (Kneedle on the measured curve;
    on a curve too short for Kneedle's threshold, the last level that kept up before one
    that did not), or that it still follows at the highest level measured."""
    pts = sorted((r.level, r.rate) for r in rows if r.rate is not None)
    if len(pts) < 3:
        return ""
    knee = find_knee([x for x, _ in pts], [y for _, y in pts], curve="concave")
    top_offered, top_served = pts[-1]
    behind = next((i for i, (x, y) in enumerate(pts) if x > 0 and y < KEPT_UP * x), None)
    if knee is None and behind is not None and behind > 0:
        knee = pts[behind - 1][0]
    if knee is None:
        return (
            f"no knee in the throughput curve up to {top_offered:g} requests/s offered "
            f"({top_served:.4g} served): serving still scales there; measure higher rates"
        )
    served = dict(pts)[knee]
    return (
        f"the throughput curve bends at {knee:g} requests/s offered ({served:.4g} served, "
        f"measured): beyond it the served rate stops following the offered rate"
        + (f" ({top_offered:g} offered, {top_served:.4g} served)" if top_offered > knee
           else "")
    )


def _measured(r: Record, *, meter: ServerMeter, repeat: int) -> Record:
    return meter.tag(restage(r, stage="serve", repeat=repeat))


def _swept(r: Record, *, extras: dict[str, object]) -> Record:
    r = restage(r, stage="serve")
    return r.model_copy(update={"extras": {**r.extras, **extras}})


def _all_started(proc: subprocess.Popen[bytes], prom_dir: Path, workers: int) -> bool:
    """Wait until `workers` processes finished start-up (see `worker_pids`); False when the
    server exits or the wait runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < WORKERS_READY_S:
        if proc.poll() is not None:
            return False
        if len(worker_pids(prom_dir)) >= workers:
            return True
        # The files are the only signal a worker gives; 0.1 s bounds how late we notice.
        time.sleep(0.1)
    return False


def _user_endpoint(r: Record, *, note: str | None = None) -> Record:
    return noted(restage(r, stage="serve").model_copy(update={"recovery": RECOVERY_UNKNOWN}),
                 note=note)


def _serve_cmd(repo: Path, port: int, *, workers: int | None = None,
               torch_threads: int | None = None, trace_out: Path | None = None) -> list[str]:
    return scalelab_cmd(ServeRun(model_repo=repo, port=port, workers=workers,
                                 torch_threads=torch_threads, trace_out=trace_out).to_argv())


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


def worker_pids(prom_dir: Path) -> set[int]:
    """Worker processes that finished start-up: each writes prometheus-client's multiprocess
    files (`histogram_<pid>.db`, ...) from its lifespan, after its models loaded."""
    out = set()
    for f in prom_dir.glob("*.db"):
        tail = f.stem.rsplit("_", 1)[-1]
        if tail.isdigit():
            out.add(int(tail))
    return out


WORKERS_READY_S = 120.0
"""How long the sweep waits for every worker of a server to finish start-up (the first one
answering ready says nothing of the others, which share its port)."""


STEP_START_S = 1.0
"""A load step's process start-up beside its warm-up and window (2-core machine)."""
SERVER_START_S = 3.0
CAPACITY_SEARCH_S = 22.0
"""One capacity search of the reference server (the 2-core reference run: 22 s each)."""
SWEEP_SHAPE_S = 9.0
"""One replica-sweep shape: its server's start and a short capacity search."""


class ServeStage(Stage[ServeSettings]):
    name = "serve"
    settings = ServeSettings
    sized = True

    def needs(self, s: ServeSettings) -> tuple[Artifact, ...]:
        return () if s.url else (FEATURES, SERVED_MODEL)

    def count(self, s: ServeSettings, repeats: int) -> int:
        searches = 1 if s.capacity and capacity_slo(s.built_objectives()) else 0
        sweep = searches * len(sweep_shapes(s, os.cpu_count() or 1))
        if s.url:
            return len(s.levels) + searches  # one chunk a level at least
        return len(s.batching) * (repeats * len(s.levels) + searches) + sweep

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
            rec = ctx.records("serve")
            rates = [s.base_rate * m for m in s.levels]
            note = metrics_note(metrics_url(s.url))
            searching = s.capacity and capacity_slo(s.built_objectives()) is not None
            ok = sized_levels(ctx, budget_key=self.name, stage=self.name, label=f"load {s.url}",
                              cmd=self._load(s, s.url, rec, rates),
                              objectives=s.built_objectives(), series=SERIES[s.baseline],
                              tag=functools.partial(_user_endpoint, note=note), rec=rec,
                              reserve_s=CAPACITY_SEARCH_S if searching else 0.0)
            # The user's endpoint gets the reference server's capacity search too: where it
            # stops meeting the objective, which the replica advice divides the peak by
            # (not after a failed sweep: an endpoint that did not answer has no capacity).
            if ok:
                self._capacity(s, ctx, SERIES[s.baseline], s.url, None, None,
                               tag=functools.partial(_user_endpoint, note=note),
                               start=grid_start(rec, s.built_objectives(), s.base_rate))
            return
        repo, dataset = ctx.artifact(SERVED_MODEL), ctx.artifact(FEATURES)
        if repo is None:
            return
        test_rows = dataset / "test.parquet" if dataset else None
        first = parse_duration(s.duration)
        clock = LevelClock(
            share_s=ctx.shares.get(self.name), levels=len(s.batching) * ctx.repeats * len(s.levels),
            cap_s=parse_duration(s.level_cap) if ctx.full else first,
            reserve_s=self._after_levels_s(s))
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
                    _serve_cmd, srepo, trace_out=spans if traced else None), log=log,
                    timeout_s=90.0)
            except RunFailedError as e:
                ctx.fail(Step(stage=self.name, label=f"serve {series}", command=None), str(e))
                continue
            try:
                for rep in range(ctx.repeats):
                    # One step per level (a chunk of it: diagnose.sizing), so the server's CPU
                    # time and responses are read before and after each: serving's cost per
                    # prediction is measured.
                    for m in s.levels:
                        url = f"{spawned.url}/v2/models/{MODEL}/infer"
                        chunk = functools.partial(
                            self._chunk, s, ctx, url=url, series=series, setting=setting,
                            rep=rep, m=m, pid=spawned.proc.pid, base=spawned.url, repo=repo,
                            data=test_rows, trace_sample=TRACE_SAMPLE if (
                                traced and m == max(s.levels)) else None)
                        merged = size_level(chunk, s.built_objectives(),
                                            first_s=parse_duration(s.duration),
                                            share_s=clock.next_share())
                        if merged is not None:
                            ctx.keep([merged])
                self._capacity(s, ctx, series, f"{spawned.url}/v2/models/{MODEL}/infer", repo,
                               test_rows)
            finally:
                stop_group(spawned.proc, grace_s=5.0)
        self._sweep(s, ctx, repo, test_rows)

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

    def _after_levels_s(self, s: ServeSettings) -> float:
        """Estimated seconds of the stage's work after its levels: server starts, capacity
        searches and the replica sweep (2-core reference run, 2026-12-03)."""
        searching = 1 if s.capacity and capacity_slo(s.built_objectives()) else 0
        shapes = len(sweep_shapes(s, os.cpu_count() or 1)) if searching else 0
        return (SERVER_START_S * len(s.batching) + CAPACITY_SEARCH_S * searching * len(s.batching)
                + SWEEP_SHAPE_S * shapes)

    def minimum_s(self, s: ServeSettings, repeats: int) -> float:
        if s.url:
            return len(s.levels) * (parse_duration(s.duration) + WARMUP_S + STEP_START_S) + \
                CAPACITY_SEARCH_S
        steps = len(s.batching) * repeats * len(s.levels)
        return steps * (parse_duration(s.duration) + WARMUP_S + STEP_START_S) + \
            self._after_levels_s(s)

    def _capacity(self, s: ServeSettings, ctx: Context, series: str, url: str,
                  repo: Path | None, data: Path | None,
                  tag: Callable[[Record], Record] | None = None,
                  start: float | None = None) -> None:
        objectives = s.built_objectives()
        slo = capacity_slo(objectives)
        if not s.capacity or slo is None:
            return
        floor_s = parse_duration(s.capacity_step)
        # Sized by the rule: a step shorter than the requests its quantile needs can only end
        # undecided, and an undecided step says nothing about the rate (it is not a miss).
        need = search_requests(objectives, availability=s.capacity_availability)
        first = start or s.base_rate
        step_s = step_seconds(need, first, floor_s)
        rec = ctx.records(f"serve-capacity-{series}")
        cmd = LoadCapacity(url=url, slo=slo[0],
                           error_budget=slo[1] if s.capacity_availability else None,
                           start=first, max_rate=s.base_rate * max(s.levels) * 20,
                           min_step=f"{floor_s / 2:g}s", max_step=f"{step_s:g}s",
                           max_steps=s.capacity_max_steps, warmup="0.5s", records=rec,
                           payload="flights" if repo else None, model=MODEL if repo else None,
                           model_repo=repo, data=data)
        ctx.run(
            Step(stage=self.name, label=f"serve {series} capacity", command=cmd, records=rec,
                 series=series + CAPACITY,
                 tag=tag or functools.partial(restage, stage=self.name), timeout_s=600)
        )

    def _sweep(self, s: ServeSettings, ctx: Context, repo: Path, data: Path | None) -> None:
        """The replica sweep: one server per shape, each a capacity search at the objectives."""
        shapes = sweep_shapes(s, os.cpu_count() or 1)
        if not (s.capacity and capacity_slo(s.built_objectives()) and shapes):
            return
        setting = s.replicas_batching
        srepo = batching_repo(repo, ctx.work / f"repo-replicas-{setting}",
                              batching=setting == "on", serial_ms=s.serial_ms)
        # The one-server search of the same setting already bracketed the capacity: starting
        # at half of it skips the slow low-rate steps (40 req/s needs 7 s for 230 requests).
        done = ctx.work / "records" / f"serve-capacity-{SERIES[setting]}.jsonl"
        passed = [r.level for r in (read_records(done) if done.is_file() else [])
                  if r.extras.get("rate_verdict", r.extras.get("verdict")) == "pass"]
        start = sweep_start(passed, s.base_rate)
        ctx.logs.mkdir(parents=True, exist_ok=True)
        for shape in shapes:
            label = f"serve {shape.series} capacity"
            prom = ctx.work / f"prom-{shape.series}"
            shutil.rmtree(prom, ignore_errors=True)
            prom.mkdir(parents=True)
            # Every shape, one worker included, keeps its metrics in multiprocess mode, so the
            # sweep's points pay the same metrics cost and each worker shows up as files.
            env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom)}
            try:
                spawned = start_server(
                    functools.partial(_serve_cmd, srepo, workers=shape.processes,
                                      torch_threads=shape.threads),
                    log=ctx.logs / f"server-{shape.series}.log", env=env,
                    timeout_s=WORKERS_READY_S)
            except RunFailedError as e:
                ctx.fail(Step(stage=self.name, label=label, command=None), str(e))
                continue
            try:
                if not _all_started(spawned.proc, prom, shape.processes):
                    ctx.fail(Step(stage=self.name, label=label, command=None),
                             f"{shape.processes} workers did not all start within "
                             f"{WORKERS_READY_S:g} s; see {ctx.logs}/server-{shape.series}.log")
                    continue
                extras = {"replicated": SERIES[setting], "server_processes": shape.processes,
                          "torch_threads": shape.threads, "ready_s": spawned.ready_s}
                self._capacity(s, ctx, shape.series, f"{spawned.url}/v2/models/{MODEL}/infer",
                               repo, data, tag=functools.partial(_swept, extras=extras),
                               start=start)
            finally:
                stop_group(spawned.proc, grace_s=5.0)

    def goals(self, s: ServeSettings) -> list[StageGoal]:
        return [
            StageGoal(stage=self.name, objectives=s.built_objectives(),
                      baseline_series=SERIES[s.baseline], target_multiple=s.target_multiple,
                      advisor=advise)
        ]


STAGE = ServeStage()

