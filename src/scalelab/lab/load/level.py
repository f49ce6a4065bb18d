"""A load level, whatever drives it: its plan, P spawned processes, the merge and the cluster.

One Python process offers on the order of 10k requests/s; past that the generator itself would
lag, so `processes > 1` starts P spawned workers, each with every P-th due time of one schedule
(an even rate/P stream) or a 1/P share of the closed-loop clients, all starting at the same
CLOCK_MONOTONIC instant (system-wide on Linux), and merges their parts. The protocols (plain
HTTP in `http/run.py`, token streams in `llm/run.py`) each say how one process runs its share
and how parts merge; the plan, the processes and the cluster verdict are this module's.
"""

from __future__ import annotations

import abc
import math
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.lab.load import clock
from scalelab.lab.load.cluster import WORKERS, Cluster, named_reasons
from scalelab.lab.load.cluster import shares as cluster_shares
from scalelab.lab.load.result import LevelResult
from scalelab.lab.load.schedule import Arrival, schedule
from scalelab.lab.load.send import SendConfig

SendT = TypeVar("SendT", bound=SendConfig)
_START_MARGIN_S = 0.25
"""Between the last worker reporting ready and the common start."""


class ProcessSettings(NamedTuple):
    """What a plan's per-process config says about the level."""

    mode: str
    warmup_s: float
    concurrency: int
    timeout_s: float


ResultT = TypeVar("ResultT", bound=LevelResult)


@dataclass(kw_only=True)
class LevelPlan(abc.ABC, Generic[ResultT]):
    """What every load level has, whatever drives it: the rate or clients, the length, the
    seed and the processes. Subclasses add the per-process config (`send_config`: `mode`,
    `warmup_s`, `concurrency` come from it) and how their parts merge."""

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

    def __post_init__(self) -> None:
        self._check()

    @abc.abstractmethod
    def send_config(self) -> SendConfig:
        """The per-process config (the protocol's `SendConfig`)."""

    def settings(self) -> ProcessSettings:
        """Mode, warm-up, closed-loop clients and timeout of the per-process config."""
        c = self.send_config()
        return ProcessSettings(c.mode, c.warmup_s, c.concurrency, c.timeout_s)

    @abc.abstractmethod
    def merge_parts(self, parts: Sequence[Any], **common: Any) -> ResultT:
        """The protocol's merge of per-process parts; `common` is what `merge` passes."""

    def merge(self, parts: Sequence[Any], *, offered_rps: float | None = None,
              more: str = "--processes") -> ResultT:
        """Merge per-process parts into the level's result; `offered_rps` overrides the plan's
        rate (one cluster worker's share), `more` is what the fixes ask to add for more
        generators (--processes, or Dask workers)."""
        mode, _, concurrency, _ = self.settings()
        rate = offered_rps if offered_rps is not None else self.rate
        return self.merge_parts(parts, mode=mode, offered_rps=rate if mode == "open" else None,
                                concurrency=concurrency if mode == "closed" else None,
                                arrival=self.arrival if mode == "open" else None,
                                window_s=self.window_s(), more=more)

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

    def process_config(self, cfg: SendT, index: int) -> SendT:
        """`cfg` for process `index`: open loop, with the planned measured window
        (`window_s`); closed loop, its share of the clients, of the measured requests and the
        duration (see `share`)."""
        if cfg.mode == "open":
            return replace(cfg, window_s=self.window_s())
        conc, n, dur = self.share(index)
        return replace(cfg, concurrency=conc, max_requests=n, duration_s=dur)

    def length_s(self) -> float:
        """The planned span from the common start (warm-up included), for the report-back
        deadline."""
        length = (self.duration_s or 0.0) + self.settings().warmup_s
        if self.requests is not None and self.rate:
            length += self.requests / self.rate
        return length


PlanT = TypeVar("PlanT", bound=LevelPlan[Any])
PartRunner = Callable[[PlanT, int, "list[float] | None", Callable[[], float]], Any]
"""Runs process `index`'s share of a plan (a module-level function: it crosses a spawn)."""


def run_parts(run_part: PartRunner[PlanT], plan: PlanT, times: list[float] | None,
              one: Callable[[], Any], stop_check: object | None) -> list[Any]:
    """A level's parts: `one()` in this process, or `run_part` in `plan.processes` spawned
    ones; a stopping rule (`stop_check`) needs the single process."""
    if plan.processes == 1:
        return [one()]
    if stop_check is not None:
        raise BadUsageError("a stopping rule needs a single generator process")
    return run_processes(run_part, plan, times)


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


def cluster_workers(plan: LevelPlan[Any], cluster: Cluster,
                    stop_check: object | None) -> list[str]:
    """The workers a cluster level runs on (one generator each), after checking the plan
    asks for what a cluster can do."""
    if stop_check is not None:
        raise BadUsageError("a stopping rule needs a single generator process, not a cluster")
    if plan.processes != 1:
        raise BadUsageError("with --cluster every Dask worker runs one generator; start more "
                            "workers (dask worker --nworkers N) instead of --processes")
    return cluster.workers()


def run_on_cluster(plan: PlanT, run_part: PartRunner[PlanT], workers: list[str],
                   times: list[float] | None, cluster: Cluster,
                   lag_p99_ms: Callable[[Any], float | None], *,
                   patch: Callable[[list[Any]], None] | None = None) -> Any:
    """A level on `workers` (from `cluster_workers`), one generator each running `run_part`
    on its share; `patch` may amend the parts before the merge."""
    plan = replace(plan, processes=len(workers))
    parts, clocks = cluster.run(run_part, plan, workers, schedule=times,
                                length_s=plan.length_s() + plan.settings().timeout_s)
    if patch is not None:
        patch(parts)
    return cluster_result(plan, parts, clocks, cluster, lag_p99_ms)


def cluster_result(plan: LevelPlan[ResultT], parts: list[Any], clocks: Any, cluster: Cluster,
                   lag_p99_ms: Callable[[ResultT], float | None]) -> ResultT:
    """The merged cluster level, judged share by share: every worker's part merged alone
    against its 1/P of the rate, and the level invalid when any share was."""
    r = plan.merge(parts, more=WORKERS)

    def judge(part: Any, n: int) -> tuple[int, float, float | None, list[str]]:
        one = plan.merge([part], offered_rps=None if plan.rate is None else plan.rate / n,
                         more=WORKERS)
        return one.requests, one.sent_rps, lag_p99_ms(one), one.invalid_reasons

    level = cluster_shares(parts, clocks, scheduler=cluster.address,
                           offered_rps=plan.rate if plan.settings().mode == "open" else None,
                           judge=judge)
    reasons = r.invalid_reasons + named_reasons(level)
    return replace(r, valid=not reasons, invalid_reasons=reasons,
                   cluster=level)
