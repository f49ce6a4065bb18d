"""Run a load plan in one process or several, and merge the results.

One Python process offers on the order of 10k requests/s; past that the generator itself would
lag, so `processes > 1` starts P spawned workers, each with every P-th due time of one schedule
(an even rate/P stream) or a 1/P share of the closed-loop clients, all starting at the same
CLOCK_MONOTONIC instant (system-wide on Linux), and merges their histograms.
"""

from __future__ import annotations

import abc
import math
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

import numpy as np

from scalelab.core.errors import BadUsageError, RunFailedError
from scalelab.load import clock
from scalelab.load.cluster import WORKERS, Cluster, named_reasons
from scalelab.load.cluster import shares as cluster_shares
from scalelab.load.http.generator import Engine, EngineConfig, PartResult, Progress
from scalelab.load.http.result import LoadResult, merge
from scalelab.load.schedule import Arrival, schedule

_START_MARGIN_S = 0.25
"""Between the last worker reporting ready and the common start."""


class ProcessSettings(NamedTuple):
    """What a plan's per-process config says about the level."""

    mode: str
    warmup_s: float
    concurrency: int
    timeout_s: float


@dataclass(kw_only=True)
class LevelPlan(abc.ABC):
    """What every load level has, whatever drives it (plain HTTP here, token streams in
    `llm_run`): the rate or clients, the length, the seed and the processes. Subclasses add
    the per-process settings (`mode`, `warmup_s`, `concurrency` come from them)."""

    rate: float | None = None
    """Open loop: arrivals per second."""
    arrival: Arrival = "constant"
    """Open loop: constant or poisson spacing."""
    duration_s: float | None = None
    """Measured length (warm-up comes on top); give this or `requests`."""
    requests: int | None = None
    """Measured requests (warm-up comes on top); give this or `duration_s`."""
    seed: int = 0
    """Poisson schedule seed."""
    processes: int = 1
    """Generator processes."""

    @abc.abstractmethod
    def settings(self) -> ProcessSettings:
        """Mode, warm-up, closed-loop clients and timeout of the per-process config."""

    def _check(self) -> None:
        mode, _, concurrency, _ = self.settings()
        if self.processes < 1:
            raise BadUsageError(f"--processes must be at least 1, got {self.processes}")
        if (self.duration_s is None) == (self.requests is None):
            raise BadUsageError("give exactly one of --duration or --requests")
        if mode == "open" and self.rate is None:
            raise BadUsageError("open loop needs --rate")
        if mode == "closed" and self.processes > concurrency:
            raise BadUsageError(
                f"--processes {self.processes} is more than --concurrency "
                f"{concurrency}; each process needs at least one client")

    def times(self) -> np.ndarray:
        """The whole open-loop schedule (warm-up included), seconds from the start."""
        assert self.rate is not None
        warm = self.settings().warmup_s
        if self.duration_s is not None:
            return schedule(self.rate, duration_s=warm + self.duration_s, arrival=self.arrival,
                            seed=self.seed)
        assert self.requests is not None
        n_warm = math.ceil(warm * self.rate - 1e-9) if warm > 0 else 0
        return schedule(self.rate, requests=self.requests + n_warm, arrival=self.arrival,
                        seed=self.seed)

    def window_s(self) -> float | None:
        if self.settings().mode != "open" or self.duration_s is not None:
            return self.duration_s
        assert self.rate is not None and self.requests is not None
        return self.requests / self.rate

    def share(self, index: int) -> tuple[int, int | None, float | None]:
        """Closed loop: process `index`'s (clients, measured requests, duration incl. warm-up)."""
        _, warm, concurrency, _ = self.settings()
        p = self.processes
        conc = concurrency // p + (1 if index < concurrency % p else 0)
        n = None if self.requests is None else self.requests // p + (
            1 if index < self.requests % p else 0)
        dur = None if self.duration_s is None else self.duration_s + warm
        return conc, n, dur

    def length_s(self) -> float:
        """The planned span from the common start (warm-up included), for the report-back
        deadline."""
        length = (self.duration_s or 0.0) + self.settings().warmup_s
        if self.requests is not None and self.rate:
            length += self.requests / self.rate
        return length


@dataclass(kw_only=True)
class LoadPlan(LevelPlan):
    """One load level: the engine settings plus rate or concurrency and length."""

    engine: EngineConfig
    """Target, requests, timeouts (mode and closed-loop length live here too)."""
    cold_start: bool = True
    """Time one request on a fresh connection first (reported apart)."""

    def __post_init__(self) -> None:
        self._check()

    def settings(self) -> ProcessSettings:
        e = self.engine
        return ProcessSettings(e.mode, e.warmup_s, e.concurrency, e.timeout_s)


def _engine_for(plan: LoadPlan, index: int) -> EngineConfig:
    cfg = plan.engine
    if cfg.mode == "open":
        return cfg
    conc, n, dur = plan.share(index)
    return replace(cfg, concurrency=conc, max_requests=n, duration_s=dur)


async def _run_one(cfg: EngineConfig, times: list[float] | None, cold: bool,
                   start: Callable[[], float],
                   stop_check: Callable[[Progress], bool] | None) -> Any:
    eng = Engine(cfg)
    if cold:
        await eng.cold_start()
    # `start` may block on the other workers; nothing else runs on this loop yet.
    start_at = start()
    if cfg.mode == "open":
        assert times is not None
        return await eng.run_open(times, start_at, stop_check)
    return await eng.run_closed(start_at, stop_check)


def _load_part(plan: LoadPlan, index: int, times: list[float] | None,
               start: Callable[[], float]) -> Any:
    with clock.realtime(plan.engine.realtime):
        return clock.run(_run_one(_engine_for(plan, index), times,
                                  plan.cold_start and index == 0, start, None),
                         plan.engine.loop_impl)


PlanT = TypeVar("PlanT", bound=LevelPlan)
PartRunner = Callable[[PlanT, int, "list[float] | None", Callable[[], float]], Any]
"""Runs process `index`'s share of a plan (a module-level function: it crosses a spawn)."""


def _worker(run_part: PartRunner[PlanT], plan: PlanT, index: int, times: list[float] | None,
            ready: Any, go: Any, start_at: Any, out: Any) -> None:
    def start() -> float:
        ready.wait()
        go.wait()
        return float(start_at.value)

    try:
        out.put((index, run_part(plan, index, times, start), None))
    except BaseException as e:
        out.put((index, None, f"{type(e).__name__}: {e}"))


def run_load(plan: LoadPlan, *, stop_check: Callable[[Progress], bool] | None = None,
             slo_threshold_s: float | None = None, cluster: Cluster | None = None) -> LoadResult:
    """Run one level; `stop_check` (one process only) may end it early. With `cluster`, one
    generator a Dask worker (`cluster.py`) instead of local processes."""
    cfg = plan.engine
    if slo_threshold_s is not None:
        cfg = replace(cfg, slo_threshold_s=slo_threshold_s)
        plan = replace(plan, engine=cfg)
    times = plan.times().tolist() if cfg.mode == "open" else None
    if cluster is not None:
        return _run_on_cluster(plan, times, cluster, stop_check)
    if plan.processes == 1:
        with clock.realtime(cfg.realtime):
            parts = [clock.run(_run_one(_engine_for(plan, 0), times, plan.cold_start,
                                        lambda: clock.now() + 0.05, stop_check),
                               cfg.loop_impl)]
    else:
        if stop_check is not None:
            raise BadUsageError("a stopping rule needs a single generator process")
        parts = run_processes(_load_part, plan, times)
    return _merge(plan, parts)


def _merge(plan: LoadPlan, parts: list[PartResult],
           offered_rps: float | None = None, more: str = "--processes") -> LoadResult:
    cfg = plan.engine
    rate = offered_rps if offered_rps is not None else plan.rate
    return merge(parts, mode=cfg.mode, offered_rps=rate if cfg.mode == "open" else None,
                 concurrency=cfg.concurrency if cfg.mode == "closed" else None,
                 arrival=plan.arrival if cfg.mode == "open" else None, window_s=plan.window_s(),
                 slo_threshold_s=cfg.slo_threshold_s, realtime=cfg.realtime, more=more)


def _cold_probe(plan: LoadPlan) -> tuple[float | None, str | None]:
    async def probe() -> tuple[float | None, str | None]:
        eng = Engine(plan.engine)
        await eng.cold_start()
        return eng.res.cold_start_s, eng.res.cold_start_error

    return clock.run(probe(), plan.engine.loop_impl)


def _run_on_cluster(plan: LoadPlan, times: list[float] | None, cluster: Cluster,
                    stop_check: Callable[[Progress], bool] | None) -> LoadResult:
    if stop_check is not None:
        raise BadUsageError("a stopping rule needs a single generator process, not a cluster")
    if plan.processes != 1:
        raise BadUsageError("with --cluster every Dask worker runs one generator; start more "
                            "workers (dask worker --nworkers N) instead of --processes")
    workers = cluster.workers()
    p = len(workers)
    # The cold-start probe runs apart, before the shares are handed out, so a slow first
    # request cannot make worker 0 miss the agreed start.
    cold = cluster.call(_cold_probe, plan, prefer=workers[0],
                        timeout_s=plan.engine.timeout_s * 2 + 60) if plan.cold_start else None
    plan = replace(plan, processes=p, cold_start=False)
    shares = [None if times is None else split_list(times, p, i) for i in range(p)]
    parts, clocks = cluster.run(_load_part, plan, shares, workers,
                                length_s=plan.length_s() + plan.engine.timeout_s)
    if cold is not None:
        parts[0] = replace(parts[0], cold_start_s=cold[0], cold_start_error=cold[1])
    r = _merge(plan, parts, more=WORKERS)

    def judge(part: PartResult, n: int) -> tuple[int, float, float | None, list[str]]:
        one = _merge(plan, [part], offered_rps=None if plan.rate is None else plan.rate / n,
                     more=WORKERS)
        return one.requests, one.sent_rps, one.lag_p99_ms, one.invalid_reasons

    level = cluster_shares(parts, clocks, scheduler=cluster.address,
                           offered_rps=plan.rate if plan.engine.mode == "open" else None,
                           judge=judge)
    reasons = r.invalid_reasons + named_reasons(level)
    return replace(r, valid=not reasons, invalid_reasons=reasons, cluster=level)


def run_processes(run_part: PartRunner[PlanT], plan: PlanT,
                  times: list[float] | None) -> list[Any]:
    """Run `plan.processes` spawned workers, each `run_part` on every P-th due time (or its
    share of the clients), all started at one CLOCK_MONOTONIC instant; their parts in order."""
    ctx = mp.get_context("spawn")
    p = plan.processes
    ready = ctx.Barrier(p + 1)
    go = ctx.Barrier(p + 1)
    start_at = ctx.Value("d", 0.0)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, daemon=True, args=(
            run_part, plan, i, None if times is None else split_list(times, p, i), ready, go,
            start_at, out))
        for i in range(p)
    ]
    for pr in procs:
        pr.start()
    try:
        ready.wait(timeout=120)
        start_at.value = clock.now() + _START_MARGIN_S
        go.wait(timeout=30)
        deadline = time.monotonic() + plan.length_s() + plan.settings().timeout_s + 120
        results: dict[int, Any] = {}
        while len(results) < p:
            try:
                i, res, err = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RunFailedError(
                    "generator processes did not report back in time; rerun with fewer "
                    "--processes or a shorter --duration") from None
            if err is not None:
                raise RunFailedError(f"generator process {i} failed: {err}")
            results[i] = res
        return [results[i] for i in range(p)]
    except RunFailedError:
        raise
    except Exception as e:
        raise RunFailedError(f"could not run {p} generator processes: {type(e).__name__}: {e}") \
            from e
    finally:
        for pr in procs:
            pr.join(timeout=5)
            if pr.is_alive():
                pr.kill()
                pr.join(timeout=5)


def split_list(times: list[float], parts: int, index: int) -> list[float]:
    """`schedule.split` for a plain list (what crosses the process boundary)."""
    if parts < 1 or not (0 <= index < parts):
        raise BadUsageError(f"bad split {index} of {parts}")
    return times[index::parts]
