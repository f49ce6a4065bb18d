"""Run a streaming load level in one process or several; search the token-SLO capacity.

Several processes each take every P-th due time of one schedule (an even rate/P stream) or a
1/P share of the closed-loop clients, start at one CLOCK_MONOTONIC instant (system-wide on
Linux), and ship back plain results whose histograms and per-request arrays are merged.

The capacity search is `capacity.confirmed_search`, as `load capacity`'s (double while passing,
then bisect, then a confirmation run at the answer) with each search step stopped by
`TokenStepRule`; it reports the capacity in requests/s and the output tokens/s its confirmation
run delivered.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scalelab.lab.core.errors import RunFailedError
from scalelab.lab.core.records import Record
from scalelab.lab.load import level
from scalelab.lab.load.capacity import (
    CONFIRM_S,
    CONFIRM_VARIABLE,
    CapacityResult,
    Deadline,
    SearchConfig,
    Step,
    confirmed_search,
    rate_verdicts,
    step_extras,
)
from scalelab.lab.load.cluster import Cluster
from scalelab.lab.load.driver import StopCheck
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.llm.result import LlmResult, merge, to_record
from scalelab.lab.load.llm.stream import ProbeAnswer, StreamConfig, StreamDriver, StreamPart
from scalelab.lab.load.llm.token_slo import Samples, TokenSlo, TokenStepRule
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
    """The search (steps' rates in requests/s), its confirmations among its steps."""
    capacity_tps: float | None
    """Output tokens/s at the capacity: its confirmation run's where one passed, else the
    highest passing step's."""
    capacity_goodput_tps: float | None
    """Goodput (tokens/s of requests within every objective) in that same run."""
    levels: list[LlmResult]
    """Every step's full result, in the order run (one per `result.steps`)."""
    confirm_s: float = 0.0
    """Length of each confirmation run (0: none was run)."""

    def records(self, *, experiment: str, url: str, workload: str, slo: TokenSlo,
                price_per_hour_usd: float | None) -> list[Record]:
        """One record per step, with what the search decided of it (`capacity.step_extras`);
        a confirmation's variable is `CONFIRM_VARIABLE`, apart from the steps at its rate."""
        out: list[Record] = []
        steps = self.result.steps
        for i, (s, r, v) in enumerate(zip(steps, self.levels, rate_verdicts(self.result),
                                          strict=True)):
            rec = to_record(r, experiment=experiment, url=url, workload=workload, slo=slo,
                            price_per_hour_usd=price_per_hour_usd,
                            extra=step_extras(s, i, v))
            out.append(rec.model_copy(update={"variable": CONFIRM_VARIABLE})
                       if s.confirmation else rec)
        return out


def capacity(make_plan: Callable[[float, int], LlmPlan], rule: TokenStepRule,
             cfg: SearchConfig, *, on_step: Callable[[float, bool], None] | None = None,
             url: str = "", cluster: Cluster | None = None, confirm_s: float = CONFIRM_S,
             max_confirms: int | None = None, deadline: Deadline | None = None) -> LlmCapacity:
    """Highest arrival rate meeting `rule.slo`, confirmed as `load capacity`'s answer is
    (`capacity.confirmed_search`: a `confirm_s` run at the answer, never stopped early; a failed
    one sends the search below it; 0: no confirmation). `make_plan(rate, step_index)` builds a
    step; with `cluster` each step is a cluster level and runs its full length (no early
    stop). `on_step` is told each (rate, is a confirmation) before it runs; nothing starts that
    `deadline` leaves no time for."""
    levels: list[LlmResult] = []

    def measure(rate: float, confirmation: bool) -> Step:
        if on_step is not None:
            on_step(rate, confirmation)
        plan = make_plan(rate, len(levels))
        if confirmation:
            plan = replace(plan, duration_s=confirm_s, requests=None)
        stop = None if (cluster or confirmation) else rule.should_stop
        r = run_llm(plan, stop_check=stop, cluster=cluster)
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
                    confirmation=confirmation,
                    extras={"output_tps": r.output_tps, "level": len(levels) - 1})

    res = confirmed_search(functools.partial(measure, confirmation=False),
                           functools.partial(measure, confirmation=True), cfg,
                           max_confirms=max_confirms if confirm_s > 0 else 0,
                           deadline=deadline)
    best = None
    if res.capacity_rps is not None:
        # The confirmation run's tokens/s where one held (the longer run), else the step's.
        held = [s for s in res.steps if s.rate == res.capacity_rps and s.passed]
        one = next((s for s in held if s.confirmation), held[-1] if held else None)
        best = levels[int(one.extras["level"])] if one is not None else None  # type: ignore[call-overload]
    good = best.judge(rule.slo)[1].goodput_tps if best is not None else None
    return LlmCapacity(result=res, capacity_tps=best.output_tps if best else None,
                       capacity_goodput_tps=good, levels=levels, confirm_s=confirm_s)
