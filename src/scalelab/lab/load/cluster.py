"""Run a load level's generators on a Dask cluster's workers: processes on other hosts.

The same spine as `level.run_processes`, with hosts for processes: worker `i` of P gets
every P-th due time of the one global schedule (or a 1/P share of the closed-loop clients), so
the union of the shares is exactly the single-process schedule; all start at one agreed
instant; each ships back the plain part it measured, and the caller merges the parts exactly as
it merges local processes' (histograms added, counters summed).

Shares. A worker is handed a `Share` — its index, the number of shares, and the length and
SHA-256 of the whole schedule — never the due times: it rebuilds the schedule from the plan
(rate, arrival, seed, length: a pure function) and keeps every P-th time from its index. A
task's size does not grow with the offer (a 120,000 req/s level's times were megabytes a
worker, pickled by the client one share after another and carried through the scheduler), and
a host whose numpy draws a different Poisson schedule fails the level clearly instead of
offering other arrivals.

Start. Each worker, once its share is set up, says so on a Dask `Queue` and waits on a Dask
`Variable`; when all have, the client sets it to its `now() + START_MARGIN_S`, and each worker
moves that into its own clock. The client opens the queue before it hands out any share: the
scheduler drops a queue (and what is in it) when its last holder closes it, so a worker that
said ready and closed the queue before the client had opened it was never heard (the "not
ready 120 s after the level was handed out" failures at large offers, whose shares took long
enough to pickle that the first worker got there first). A worker that still starts late (a
busy host) sends its share late, its lag says so, and the level is invalid with that worker's
name on the reason.

Clocks. A part's times are CLOCK_MONOTONIC seconds of the host it ran on, and two hosts'
monotonic clocks share no origin. Before each level the client measures every worker's offset
NTP-style: it asks for the worker's clock several times and keeps the round with the shortest
round trip, offset = worker clock − midpoint of the client's send and receive (known to ±half
that round trip). The parts' times are put back into the client's clock before merging. The
offsets and their uncertainty are in the result, per worker.

Failures. A worker that dies or fails mid-level fails the level with its name; the level is
never merged short. The others' shares run to their end first (a running task cannot be
stopped), so the workers are free for the next level.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

import numpy as np

from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.lab.load import clock

START_MARGIN_S = 0.25
"""From the last worker saying it is ready to the agreed start (the start's hand-off)."""
READY_TIMEOUT_S = 120.0
"""Longest wait for every worker to be ready (task hand-off, imports, set-up)."""
CLOCK_ROUNDS = 8
"""Round trips per worker per offset measurement; the shortest one is kept."""
POLL_S = 0.25
"""How often the client looks for finished, failed or departed workers during a level."""
WORKERS = "Dask workers"
"""What a cluster level's fixes ask to add, where a local level asks for --processes."""
_TIME_FIELDS = ("window_start", "last_send", "last_done", "last_due")
"""A part's CLOCK_MONOTONIC instants, moved into the client's clock before merging."""

PartT = TypeVar("PartT")


@dataclass(frozen=True, kw_only=True)
class WorkerClock:
    """One worker's clock as seen from the client."""

    address: str
    """The worker's Dask address."""
    host: str
    """Its host name."""
    offset_s: float
    """Worker CLOCK_MONOTONIC minus the client's at the same instant."""
    rtt_s: float
    """The shortest round trip measured; the offset is known to ± half of it."""


@dataclass(frozen=True, kw_only=True)
class WorkerShare:
    """What one worker offered and measured in a level, judged on its own."""

    index: int
    """Its share: every P-th due time starting at this index (or its share of clients)."""
    address: str
    """The worker's Dask address."""
    host: str
    """Its host name."""
    clock_offset_ms: float
    """Its clock minus the client's (see the module doc)."""
    clock_uncertainty_ms: float
    """± this much (half the best round trip)."""
    offered_rps: float | None
    """Open loop: its share of the rate (rate / P)."""
    requests: int
    """Measured requests it sent."""
    sent_rps: float
    """Its achieved send rate."""
    lag_p99_ms: float | None
    """Its generator lag p99."""
    valid: bool
    """False when this worker did not offer its share (see invalid_reasons)."""
    invalid_reasons: list[str]
    """Why, by the same rules as a whole level."""


@dataclass(frozen=True, kw_only=True)
class ClusterLevel:
    """Where a level's load came from: the scheduler and every worker's share."""

    scheduler: str
    """The Dask scheduler's address."""
    workers: list[WorkerShare]
    """One entry a worker, in share order."""


@dataclass(frozen=True, kw_only=True)
class Share:
    """What a worker is handed for its part of an open-loop schedule: a description of it."""

    index: int
    """Its share: every `parts`-th due time of the schedule from this index."""
    parts: int
    """How many shares the schedule is split into (the level's workers)."""
    count: int
    """Due times in the whole schedule (warm-up included)."""
    digest: str
    """SHA-256 of the whole schedule's float64 bytes, as the client built it."""


def _digest(times: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(times, dtype=np.float64).tobytes()).hexdigest()


def describe(schedule: Sequence[float] | np.ndarray, parts: int) -> list[Share]:
    """The `parts` shares of a whole open-loop schedule, as the workers are handed them."""
    times = np.asarray(schedule, dtype=np.float64)
    d = _digest(times)
    return [Share(index=i, parts=parts, count=len(times), digest=d) for i in range(parts)]


def share_times(plan: Any, share: Share | None) -> list[float] | None:
    """A worker's due times, rebuilt from the plan (`plan.times()`, the whole schedule) and
    checked against the client's; None for a closed loop (no schedule)."""
    if share is None:
        return None
    times = plan.times()
    if len(times) != share.count or _digest(times) != share.digest:
        raise RunFailedError(
            f"this worker ({socket.gethostname()}) rebuilt a different schedule than the client "
            f"({len(times)} due times, the client {share.count}); the client's and the workers' "
            "scalelab and numpy versions must match (Poisson arrivals are drawn by numpy)")
    out: list[float] = times[share.index::share.parts].tolist()
    return out


Judge = Callable[[Any, int], tuple[int, float, "float | None", list[str]]]
"""(part, workers) -> (requests, sent_rps, lag p99 ms, invalid reasons) of that part alone."""


def shares(parts: Sequence[Any], clocks: Sequence[WorkerClock], *, scheduler: str,
           offered_rps: float | None, judge: Judge) -> ClusterLevel:
    """Judge each worker's part on its own (`judge` is the stack's merge of one part)."""
    p = len(parts)
    out = []
    for i, (part, c) in enumerate(zip(parts, clocks, strict=True)):
        n, rps, lag99, reasons = judge(part, p)
        out.append(WorkerShare(
            index=i, address=c.address, host=c.host, clock_offset_ms=c.offset_s * 1e3,
            clock_uncertainty_ms=c.rtt_s / 2 * 1e3,
            offered_rps=None if offered_rps is None else offered_rps / p, requests=n,
            sent_rps=rps, lag_p99_ms=lag99, valid=not reasons, invalid_reasons=reasons))
    return ClusterLevel(scheduler=scheduler, workers=out)


def named_reasons(level: ClusterLevel) -> list[str]:
    """Each invalid worker's reasons, naming it (what a level adds to its own reasons)."""
    return [f"worker {w.index} ({w.address} on {w.host}): {r}"
            for w in level.workers for r in w.invalid_reasons]


def check_address(address: str) -> str:
    """A scheduler address as Dask takes it; a clear error for anything else."""
    scheme, sep, rest = address.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or scheme not in ("tcp", "tls") or not colon or not host or not port.isdigit():
        raise BadUsageError(f"--cluster {address!r} is not a Dask scheduler address; give "
                            "tcp://HOST:PORT (e.g. tcp://10.0.0.5:8786)")
    return address


def _clock_probe() -> tuple[float, str]:
    return clock.now(), socket.gethostname()


def _scheduler_workers(dask_scheduler: Any) -> list[str]:
    return list(dask_scheduler.workers)


def _remote_part(run_part: Callable[..., Any], plan: Any, index: int, share: Share | None,
                 offset_s: float, level: str) -> Any:
    from distributed import Queue, Variable

    times = share_times(plan, share)

    def start() -> float:
        # The barrier: say ready (set-up and imports done), then wait for the client's start.
        ready = Queue(f"{level}-ready")
        ready.put(index)
        ready.close()  # the scheduler drops a level's queue once every holder has closed it
        at = Variable(f"{level}-start").get(timeout=READY_TIMEOUT_S + 30)
        if at is None:
            raise RunFailedError("the client abandoned the level before its start")
        return float(at) + offset_s  # into this host's clock

    return run_part(plan, index, times, start)


class Cluster:
    """A connection to a Dask scheduler whose workers run generator shares."""

    def __init__(self, address: str, *, connect_timeout_s: float = 10.0) -> None:
        self.address = check_address(address)
        from distributed import Client

        try:
            self.client = Client(address, timeout=connect_timeout_s, set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise RunFailedError(
                f"could not reach the Dask scheduler at {address} ({type(e).__name__}: {e}); "
                "start one with `dask scheduler` and workers with `dask worker "
                f"{address} --nthreads 1`, or check the address") from e

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def workers(self) -> list[str]:
        """The workers now connected, sorted; an error when there are none."""
        ws = sorted(self.client.run_on_scheduler(_scheduler_workers))
        if not ws:
            raise RunFailedError(f"the Dask scheduler at {self.address} has no workers; start "
                                 f"some with `dask worker {self.address} --nthreads 1`")
        return ws

    def call(self, fn: Callable[..., PartT], *args: Any, prefer: str,
             timeout_s: float) -> PartT:
        """`fn(*args)` on a worker (`prefer` if it is there; another if it leaves), bounded."""
        fut = self.client.submit(fn, *args, workers=[prefer], allow_other_workers=True,
                                 pure=False)
        try:
            out: PartT = fut.result(timeout=timeout_s)
        except TimeoutError:
            self.client.cancel([fut])
            raise RunFailedError(f"the cluster did not run {fn.__name__} within {timeout_s:g} "
                                 "s; check the workers (dask worker logs)") from None
        return out

    def clocks(self, workers: Sequence[str], *, rounds: int = CLOCK_ROUNDS) -> list[WorkerClock]:
        """Every worker's clock offset from the client's (module doc), in `workers` order."""
        best: dict[str, tuple[float, float, str]] = {}
        for _ in range(rounds):
            for w in workers:
                t0 = clock.now()
                tw, host = self.client.run(_clock_probe, workers=[w])[w]
                t1 = clock.now()
                rtt = t1 - t0
                if w not in best or rtt < best[w][1]:
                    best[w] = (tw - (t0 + t1) / 2, rtt, host)
        return [WorkerClock(address=w, host=best[w][2], offset_s=best[w][0], rtt_s=best[w][1])
                for w in workers]

    def run(self, run_part: Callable[[Any, int, list[float] | None, Callable[[], float]], PartT],
            plan: Any, workers: Sequence[str], *, schedule: Sequence[float] | np.ndarray | None,
            length_s: float) -> tuple[list[PartT], list[WorkerClock]]:
        """Run share `i` of `plan` on `workers[i]`, all from one agreed start: of `schedule`
        (the whole open-loop schedule, `plan.times()`; None for a closed loop), every P-th due
        time from `i`, which the worker rebuilds from `plan` (module doc).

        Returns the parts, their times in the client's clock, and the clocks measured. Raises
        `RunFailedError` naming the worker when one fails or leaves mid-level."""
        from distributed import Queue, Variable, wait

        clocks = self.clocks(workers)
        level = f"scalelab-load-{uuid.uuid4().hex[:8]}"
        described = None if schedule is None else describe(schedule, len(clocks))
        # Both before any share goes out: a worker's ready must find the client's queue open.
        ready_q = Queue(f"{level}-ready", client=self.client)
        start_v = Variable(f"{level}-start", client=self.client)
        futs = {
            i: self.client.submit(_remote_part, run_part, plan, i,
                                  None if described is None else described[i], c.offset_s,
                                  level, workers=[c.address], allow_other_workers=False,
                                  pure=False, key=f"{level}-{i}")
            for i, c in enumerate(clocks)
        }
        results: dict[int, PartT] = {}
        released = False
        failure: str | None = None
        try:
            ready: set[int] = set()
            deadline = clock.now() + READY_TIMEOUT_S
            while len(ready) < len(futs) and failure is None:
                # All that is there, without waiting: a get that times out logs a traceback
                # on the scheduler each time.
                got = ready_q.get(batch=True)
                ready.update(int(x) for x in got)
                failure = self._failure(futs, results, clocks)
                if failure is None and len(ready) < len(futs):
                    if clock.now() > deadline:
                        late = [clocks[i].address for i in futs if i not in ready]
                        failure = (f"generator workers {', '.join(late)} were not ready "
                                   f"{READY_TIMEOUT_S:.0f} s after the level was handed out; "
                                   "check them (dask worker logs)")
                    elif not got:
                        time.sleep(POLL_S)
            if failure is None:
                start = clock.now() + START_MARGIN_S + max(c.rtt_s for c in clocks)
                start_v.set(start)
                released = True
                deadline = start + length_s + 60.0
            while len(results) < len(futs) and failure is None:
                pending = [f for i, f in futs.items() if i not in results]
                with contextlib.suppress(TimeoutError), self.client.as_current():
                    wait(pending, timeout=POLL_S, return_when="FIRST_COMPLETED")
                failure = self._failure(futs, results, clocks)
                if failure is None and len(results) < len(futs) and clock.now() > deadline:
                    late = [clocks[i].address for i in futs if i not in results]
                    failure = (f"generator workers {', '.join(late)} did not report back "
                               f"{length_s + 60:.0f} s after the start; check them "
                               "(dask worker logs) or shorten --duration")
            if failure is not None:
                if not released:
                    start_v.set(None)
                    deadline = clock.now() + 30.0
                self._drain(futs, results, clocks, deadline)
                raise RunFailedError(failure)
        finally:
            self.client.cancel([f for i, f in futs.items() if i not in results])
            with contextlib.suppress(Exception):
                start_v.delete()
                ready_q.close()
        parts = [_to_client_clock(results[i], clocks[i].offset_s) for i in range(len(futs))]
        return parts, clocks

    def _failure(self, futs: dict[int, Any], results: dict[int, Any],
                 clocks: Sequence[WorkerClock]) -> str | None:
        """Collect finished parts into `results`; what went wrong, naming the worker, if
        anything did (a task failed, or its worker left the cluster)."""
        for i, f in futs.items():
            if i in results:
                continue
            if f.status == "finished":
                results[i] = f.result()
            elif f.status in ("error", "cancelled"):
                exc = f.exception() if f.status == "error" else "cancelled"
                return (f"generator worker {i} ({clocks[i].address} on {clocks[i].host}) "
                        f"failed: {type(exc).__name__}: {exc}")
        if len(results) == len(futs):
            return None
        alive = set(self.client.run_on_scheduler(_scheduler_workers))
        gone = [i for i in futs if i not in results and clocks[i].address not in alive]
        if not gone:
            return None
        return "; ".join(
            f"generator worker {i} ({clocks[i].address} on {clocks[i].host}) left the cluster "
            "mid-level (killed or crashed)" for i in gone) + (
            f"; the level is incomplete ({len(results)} of {len(futs)} shares came back) and "
            "was not merged; rerun it")

    def _drain(self, futs: dict[int, Any], results: dict[int, Any],
               clocks: Sequence[WorkerClock], deadline: float) -> None:
        """Let the surviving shares end (a running task cannot be stopped), so the workers
        are free for the next level; bounded by the level's deadline."""
        from distributed import wait

        alive = set(self.client.run_on_scheduler(_scheduler_workers))
        live = [f for i, f in futs.items() if i not in results and clocks[i].address in alive
                and f.status == "pending"]
        if live:
            with contextlib.suppress(TimeoutError), self.client.as_current():
                wait(live, timeout=max(0.0, deadline - clock.now()))


def _to_client_clock(part: PartT, offset_s: float) -> PartT:
    names = {f.name for f in fields(part)}  # type: ignore[arg-type]
    moved = {n: getattr(part, n) - offset_s for n in _TIME_FIELDS
             if n in names and getattr(part, n) != 0.0}
    return replace(part, **moved)  # type: ignore[type-var]

