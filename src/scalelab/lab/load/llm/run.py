"""Run a streaming load level in one process or several; search the token-SLO capacity.

Several processes each take every P-th due time of one schedule (an even rate/P stream) or a
1/P share of the closed-loop clients, start at one CLOCK_MONOTONIC instant (system-wide on
Linux), and ship back plain results whose histograms and per-request arrays are merged.

The capacity search is `capacity.search` (double while passing, then bisect) with each step
stopped by `TokenStepRule`; it reports the capacity in requests/s and the output tokens/s the
passing step delivered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scalelab.lab.core.errors import RunFailedError
from scalelab.lab.load import level
from scalelab.lab.load.capacity import CapacityResult, SearchConfig, Step, search
from scalelab.lab.load.cluster import Cluster
from scalelab.lab.load.driver import StopCheck
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.llm.result import LlmResult, merge
from scalelab.lab.load.llm.stream import ProbeAnswer, StreamConfig, StreamDriver, StreamPart
from scalelab.lab.load.llm.token_slo import Samples, TokenStepRule
from scalelab.lab.load.result import all_failed_line


@dataclass(kw_only=True)
class LlmPlan(level.LevelPlan[LlmResult]):
    """One streaming load level (rate, length, seed and processes as in `LevelPlan`)."""

    stream: StreamConfig
    """Target, requests, mode, concurrency, timeouts."""

    def send_config(self) -> StreamConfig:
        return self.stream

    def merge_parts(self, parts: Sequence[Any], **common: Any) -> LlmResult:
        return merge(parts, **common)


def _config_for(plan: LlmPlan, index: int) -> StreamConfig:
    cfg = plan.stream
    if index > 0 and cfg.probe_requests:
        cfg = replace(cfg, probe_requests=[])  # the probe is sent once, by the first process
    return plan.process_config(cfg, index)


async def _run_one(cfg: StreamConfig, times: list[float] | None, start: Callable[[], float],
                   stop_check: StopCheck[Samples] | None) -> StreamPart:
    return await StreamDriver(cfg).run(times, start, stop_check)


def _stream_part(plan: LlmPlan, index: int, times: list[float] | None,
                 start: Callable[[], float]) -> StreamPart:
    return asyncio.run(_run_one(_config_for(plan, index), times, start, None))


def run_llm(plan: LlmPlan, *, stop_check: StopCheck[Samples] | None = None,
            cluster: Cluster | None = None) -> LlmResult:
    """Run one level; `stop_check` (one process only) may end it early. With `cluster`, one
    generator a Dask worker (`cluster.py`) instead of local processes."""
    cfg = plan.stream
    times = plan.times().tolist() if cfg.mode == "open" else None
    if cluster is not None:
        return _run_on_cluster(plan, times, cluster, stop_check)

    def one() -> StreamPart:
        return asyncio.run(_run_one(_config_for(plan, 0), times,
                                    lambda: time.monotonic() + 0.05, stop_check))

    return plan.merge(level.run_parts(_stream_part, plan, times, one, stop_check))


def _run_on_cluster(plan: LlmPlan, times: list[float] | None, cluster: Cluster,
                    stop_check: StopCheck[Samples] | None) -> LlmResult:
    workers = level.cluster_workers(plan, cluster, stop_check)
    return level.run_on_cluster(plan, _stream_part, workers, times, cluster,
                                lambda r: r.lag.p99_ms)


def reference_answers(cfg: StreamConfig) -> list[ProbeAnswer]:
    """The quality probe's prompts answered one at a time (concurrency 1, no warm-up, no
    tracing): the unbatched reference every level is compared with (quality.py)."""
    probe = cfg.probe_requests
    if not probe:
        return []
    ref = replace(cfg, requests=probe, mode="closed", concurrency=1, warmup_s=0.0,
                  duration_s=None, max_requests=len(probe), trace_sample=0.0)
    part = asyncio.run(_run_one(ref, None, lambda: time.monotonic() + 0.01, None))
    return part.probe


def check_ran(r: LlmResult, url: str) -> None:
    """Stop when the server never answered (down, wrong port): a level answered with errors
    is a measurement (the command prints it, then exits 1 when every request failed)."""
    if r.requests > 0 and r.successes == 0:
        unreachable = r.errors_by_kind.get("refused", 0) + r.errors_by_kind.get("other", 0)
        if unreachable == r.failures:
            raise RunFailedError(f"no request to {url} got an answer ({r.requests} sent); is "
                                 "the server up at that address?")


class EveryRequestFailed(RunFailedError):
    """A capacity search's first step got not one success: its likely cause, in one line
    (the CLI exits 1 with it)."""


@dataclass(frozen=True, kw_only=True)
class LlmCapacity:
    """A token-SLO capacity search's answer."""

    result: CapacityResult
    """The search (steps' rates in requests/s)."""
    capacity_tps: float | None
    """Output tokens/s of the highest passing step."""
    capacity_goodput_tps: float | None
    """Goodput (tokens/s of requests within every objective) at that step."""
    levels: list[LlmResult]
    """Every step's full result, in the order run."""


def capacity(make_plan: Callable[[float, int], LlmPlan], rule: TokenStepRule,
             cfg: SearchConfig, *, on_step: Callable[[float], None] | None = None,
             url: str = "", cluster: Cluster | None = None) -> LlmCapacity:
    """Highest arrival rate meeting `rule.slo`; `make_plan(rate, step_index)` builds a step.
    With `cluster` each step is a cluster level and runs its full length (no early stop)."""
    levels: list[LlmResult] = []

    def run_step(rate: float) -> Step:
        if on_step is not None:
            on_step(rate)
        r = run_llm(make_plan(rate, len(levels)), stop_check=None if cluster else rule.should_stop,
                    cluster=cluster)
        check_ran(r, url)
        if not levels and r.all_failed() and r.errors_by_status:
            # A wrong path, key or server answers every rate alike: no search to run.
            raise EveryRequestFailed(all_failed_line([r], url=url, llm=True) or "")
        levels.append(r)
        verdict, decided = rule.verdict(r.samples_for(rule.slo))
        ttft_q = next((o.quantile for o in rule.slo.objectives if o.metric == "ttft"), 0.95)
        h = LatencyHistogram.decode(r.blobs["ttft"])
        return Step(rate=rate, verdict=verdict if decided else f"undecided-{verdict}",  # type: ignore[arg-type]
                    requests=r.requests, throughput_rps=r.throughput_rps,
                    quantile_ms=h.quantile_ms(ttft_q), quantile_ci_ms=(None, None),
                    error_rate=r.failure_rate, valid=r.valid, wall_s=r.wall_s,
                    extras={"output_tps": r.output_tps, "level": len(levels) - 1})

    res = search(run_step, cfg)
    best = None
    if res.capacity_rps is not None:
        best = next(levels[int(s.extras["level"])] for s in res.steps  # type: ignore[call-overload]
                    if s.rate == res.capacity_rps and s.passed)
    good = best.judge(rule.slo)[1].goodput_tps if best is not None else None
    return LlmCapacity(result=res, capacity_tps=best.output_tps if best else None,
                       capacity_goodput_tps=good, levels=levels)
