"""Run an HTTP load level in one process, several (`level.run_processes`) or on a cluster.

What is HTTP's own: the engine config a process gets, the cold-start probe on a fresh
connection, and the merge with the SLO threshold and --realtime the validity rule reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scalelab.lab.load import clock, level
from scalelab.lab.load.capacity import Progress
from scalelab.lab.load.cluster import Cluster
from scalelab.lab.load.driver import StopCheck
from scalelab.lab.load.http.generator import HttpConfig, HttpDriver
from scalelab.lab.load.http.result import LoadResult, merge


@dataclass(kw_only=True)
class LoadPlan(level.LevelPlan[LoadResult]):
    """One load level: the engine settings plus rate or concurrency and length."""

    engine: HttpConfig
    """Target, requests, timeouts (mode and closed-loop length live here too)."""
    cold_start: bool = True
    """Time one request on a fresh connection first (reported apart)."""

    def send_config(self) -> HttpConfig:
        return self.engine

    def merge_parts(self, parts: Sequence[Any], **common: Any) -> LoadResult:
        return merge(parts, slo_threshold_s=self.engine.slo_threshold_s,
                     realtime=self.engine.realtime, **common)


async def _run_one(cfg: HttpConfig, times: list[float] | None, cold: bool,
                   start: Callable[[], float],
                   stop_check: StopCheck[Progress] | None) -> Any:
    eng = HttpDriver(cfg)
    if cold:
        await eng.cold_start()
    return await eng.run(times, start, stop_check)


def _load_part(plan: LoadPlan, index: int, times: list[float] | None,
               start: Callable[[], float]) -> Any:
    with clock.realtime(plan.engine.realtime):
        return clock.run(_run_one(plan.process_config(plan.engine, index), times,
                                  plan.cold_start and index == 0, start, None),
                         plan.engine.loop_impl)


def run_load(plan: LoadPlan, *, stop_check: StopCheck[Progress] | None = None,
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

    def one() -> Any:
        with clock.realtime(cfg.realtime):
            return clock.run(_run_one(plan.process_config(plan.engine, 0), times, plan.cold_start,
                                      lambda: clock.now() + 0.05, stop_check), cfg.loop_impl)

    return plan.merge(level.run_parts(_load_part, plan, times, one, stop_check))


def _cold_probe(plan: LoadPlan) -> tuple[float | None, str | None]:
    async def probe() -> tuple[float | None, str | None]:
        eng = HttpDriver(plan.engine)
        await eng.cold_start()
        return eng.res.cold_start_s, eng.res.cold_start_error

    return clock.run(probe(), plan.engine.loop_impl)


def _run_on_cluster(plan: LoadPlan, times: list[float] | None, cluster: Cluster,
                    stop_check: StopCheck[Progress] | None) -> LoadResult:
    workers = level.cluster_workers(plan, cluster, stop_check)
    # The cold-start probe runs apart, before the shares are handed out, so a slow first
    # request cannot make worker 0 miss the agreed start.
    cold = cluster.call(_cold_probe, plan, prefer=workers[0],
                        timeout_s=plan.engine.timeout_s * 2 + 60) if plan.cold_start else None

    def with_cold(parts: list[Any]) -> None:
        if cold is not None:
            parts[0] = replace(parts[0], cold_start_s=cold[0], cold_start_error=cold[1])

    return level.run_on_cluster(replace(plan, cold_start=False), _load_part, workers, times,
                                cluster, lambda r: r.lag_p99_ms, patch=with_cold)
