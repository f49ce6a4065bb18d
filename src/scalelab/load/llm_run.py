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
import math
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from scalelab.core.errors import BadUsageError, RunFailedError
from scalelab.load.capacity import CapacityResult, SearchConfig, Step, search
from scalelab.load.histogram import LatencyHistogram
from scalelab.load.llm_result import LlmResult, merge, samples_of
from scalelab.load.multiproc import split_list
from scalelab.load.schedule import Arrival, schedule
from scalelab.load.stream import StopCheck, StreamConfig, StreamEngine, StreamPart
from scalelab.load.token_slo import TokenStepRule

_START_MARGIN_S = 0.25


@dataclass(kw_only=True)
class LlmPlan:
    """One streaming load level."""

    stream: StreamConfig
    """Target, requests, mode, concurrency, timeouts."""
    rate: float | None = None
    """Open loop: arrivals per second."""
    arrival: Arrival = "constant"
    """Open loop: constant or poisson spacing."""
    duration_s: float | None = None
    """Measured length (warm-up on top); this or `requests`."""
    requests: int | None = None
    """Measured requests (warm-up on top); this or `duration_s`."""
    seed: int = 0
    """Poisson schedule seed."""
    processes: int = 1
    """Generator processes."""

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise BadUsageError(f"--processes must be at least 1, got {self.processes}")
        if (self.duration_s is None) == (self.requests is None):
            raise BadUsageError("give exactly one of --duration or --requests")
        if self.stream.mode == "open" and self.rate is None:
            raise BadUsageError("open loop needs --rate")
        if self.stream.mode == "closed" and self.processes > self.stream.concurrency:
            raise BadUsageError(f"--processes {self.processes} is more than --concurrency "
                                f"{self.stream.concurrency}; each process needs a client")

    def times(self) -> np.ndarray:
        assert self.rate is not None
        warm = self.stream.warmup_s
        if self.duration_s is not None:
            return schedule(self.rate, duration_s=warm + self.duration_s, arrival=self.arrival,
                            seed=self.seed)
        assert self.requests is not None
        n_warm = math.ceil(warm * self.rate - 1e-9) if warm > 0 else 0
        return schedule(self.rate, requests=self.requests + n_warm, arrival=self.arrival,
                        seed=self.seed)

    def window_s(self) -> float | None:
        if self.stream.mode != "open" or self.duration_s is not None:
            return self.duration_s
        assert self.rate is not None and self.requests is not None
        return self.requests / self.rate


def _config_for(plan: LlmPlan, index: int) -> StreamConfig:
    cfg = plan.stream
    if cfg.mode == "open":
        return cfg
    p = plan.processes
    conc = cfg.concurrency // p + (1 if index < cfg.concurrency % p else 0)
    n = None if plan.requests is None else plan.requests // p + (
        1 if index < plan.requests % p else 0)
    dur = None if plan.duration_s is None else plan.duration_s + cfg.warmup_s
    return replace(cfg, concurrency=conc, max_requests=n, duration_s=dur)


async def _run_one(cfg: StreamConfig, times: list[float] | None, start: Callable[[], float],
                   stop_check: StopCheck | None) -> StreamPart:
    eng = StreamEngine(cfg)
    start_at = start()
    if cfg.mode == "open":
        assert times is not None
        return await eng.run_open(times, start_at, stop_check)
    return await eng.run_closed(start_at, stop_check)


def _worker(plan: LlmPlan, index: int, times: list[float] | None, ready: Any, go: Any,
            start_at: Any, out: Any) -> None:
    def start() -> float:
        ready.wait()
        go.wait()
        return float(start_at.value)

    try:
        out.put((index, asyncio.run(_run_one(_config_for(plan, index), times, start, None)),
                 None))
    except BaseException as e:
        out.put((index, None, f"{type(e).__name__}: {e}"))


def run_llm(plan: LlmPlan, *, stop_check: StopCheck | None = None) -> LlmResult:
    """Run one level; `stop_check` (one process only) may end it early."""
    cfg = plan.stream
    times = plan.times().tolist() if cfg.mode == "open" else None
    if plan.processes == 1:
        parts = [asyncio.run(_run_one(_config_for(plan, 0), times,
                                      lambda: time.monotonic() + 0.05, stop_check))]
    else:
        if stop_check is not None:
            raise BadUsageError("a stopping rule needs a single generator process")
        parts = _run_many(plan, times)
    return merge(parts, mode=cfg.mode, offered_rps=plan.rate if cfg.mode == "open" else None,
                 concurrency=cfg.concurrency if cfg.mode == "closed" else None,
                 arrival=plan.arrival if cfg.mode == "open" else None, window_s=plan.window_s())


def _run_many(plan: LlmPlan, times: list[float] | None) -> list[StreamPart]:
    ctx = mp.get_context("spawn")
    p = plan.processes
    ready, go = ctx.Barrier(p + 1), ctx.Barrier(p + 1)
    start_at = ctx.Value("d", 0.0)
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, daemon=True, args=(
        plan, i, None if times is None else split_list(times, p, i), ready, go, start_at, out))
        for i in range(p)]
    for pr in procs:
        pr.start()
    try:
        ready.wait(timeout=120)
        start_at.value = time.monotonic() + _START_MARGIN_S
        go.wait(timeout=30)
        length = (plan.duration_s or 0.0) + plan.stream.warmup_s
        if plan.requests is not None and plan.rate:
            length += plan.requests / plan.rate
        deadline = time.monotonic() + length + plan.stream.timeout_s + 120
        results: dict[int, StreamPart] = {}
        while len(results) < p:
            try:
                i, res, err = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RunFailedError("generator processes did not report back in time; rerun "
                                     "with fewer --processes or a shorter --duration") from None
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


def check_ran(r: LlmResult, url: str) -> None:
    """Stop when the server never answered (down, wrong port, wrong path): a level answered
    with errors under overload is a measurement, not a failure."""
    if r.requests > 0 and r.successes == 0:
        unreachable = r.errors_by_kind.get("refused", 0) + r.errors_by_kind.get("other", 0)
        statuses = r.errors_by_status
        if unreachable == r.failures:
            raise RunFailedError(f"no request to {url} got an answer ({r.requests} sent); is "
                                 "the server up at that address?")
        if set(statuses) & {"400", "404", "405", "422"} and r.errors_by_kind.get("status") \
                == r.failures:
            codes = ", ".join(f"{k}×{v}" for k, v in statuses.items())
            raise RunFailedError(
                f"every request to {url} was refused as bad ({codes}); check --api "
                "(chat or completions) and --model, and try --usage final or --no-ignore-eos "
                "for a server that rejects vLLM's extra fields")


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
             url: str = "") -> LlmCapacity:
    """Highest arrival rate meeting `rule.slo`; `make_plan(rate, step_index)` builds a step."""
    levels: list[LlmResult] = []

    def stop(part: StreamPart, elapsed: float) -> bool:
        return rule.should_stop(samples_of(part), elapsed)

    def run_step(rate: float) -> Step:
        if on_step is not None:
            on_step(rate)
        r = run_llm(make_plan(rate, len(levels)), stop_check=stop)
        check_ran(r, url)
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
