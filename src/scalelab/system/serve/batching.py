"""Dynamic batching: when to dispatch (a pure function) and the loop that forms batches.

`decide` looks only at numbers (rows queued, how long the oldest has waited, the policy), so it is
tested with exact values. `collect` applies it to a real asyncio.Queue: it pulls queued jobs into
a `pending` list (never more than one batch's worth, so the bounded queue still bounds memory),
answers expired jobs before any compute, and returns when `decide` says dispatch.

Costs: every request pays up to `max_delay_s` of extra latency when traffic is light; in return a
loaded server does one forward pass per batch instead of one per request.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


@dataclass(kw_only=True, frozen=True)
class BatchPolicy:
    """Batching knobs for one model version (from config.json's dynamic_batching)."""

    max_batch_size: int
    """Most rows per forward pass."""
    max_delay_s: float
    """How long the oldest queued job may wait for company before its batch is dispatched."""
    preferred: tuple[int, ...] = ()
    """Batch sizes worth dispatching at once; the largest one formable is sent without waiting."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_delay_s < 0:
            raise ValueError("max_batch_size must be >= 1 and max_delay_s >= 0")
        if any(p < 1 or p > self.max_batch_size for p in self.preferred):
            raise ValueError("preferred sizes must lie in [1, max_batch_size]")


@dataclass(kw_only=True, frozen=True)
class BatchDecision:
    """Dispatch `dispatch` rows now (> 0), or wait up to `wait_s` for more and decide again."""

    dispatch: int
    wait_s: float


def decide(queued_rows: int, oldest_wait_s: float, policy: BatchPolicy) -> BatchDecision:
    """The batching decision, Triton's rules: full batch -> now; the largest preferred size
    formable -> now; the oldest waited max_delay -> the largest preferred size that fits, else
    everything queued (up to a full batch); otherwise wait out the oldest's remaining delay."""
    if queued_rows <= 0:
        return BatchDecision(dispatch=0, wait_s=math.inf)
    if queued_rows >= policy.max_batch_size:
        return BatchDecision(dispatch=policy.max_batch_size, wait_s=0.0)
    if policy.preferred and queued_rows >= max(policy.preferred):
        return BatchDecision(dispatch=max(policy.preferred), wait_s=0.0)
    if oldest_wait_s >= policy.max_delay_s:
        fits = [p for p in policy.preferred if p <= queued_rows]
        return BatchDecision(dispatch=max(fits) if fits else queued_rows, wait_s=0.0)
    return BatchDecision(dispatch=0, wait_s=policy.max_delay_s - oldest_wait_s)


class Batchable(Protocol):
    """What the batcher needs of a queued job."""

    rows: int
    enqueued_at: float
    deadline: float
    picked_at: float


J = TypeVar("J", bound=Batchable)


@dataclass(kw_only=True)
class Formed(Generic[J]):
    """What `collect` hands back: a batch to compute, or jobs whose deadline passed."""

    batch: list[J] = field(default_factory=list)
    expired: list[J] = field(default_factory=list)


def take_prefix(pending: list[J], rows: int) -> list[J]:
    """Pop the longest FIFO prefix of `pending` holding at most `rows` rows (at least 1 job)."""
    n, total = 0, 0
    while n < len(pending) and (n == 0 or total + pending[n].rows <= rows):
        total += pending[n].rows
        n += 1
    out = pending[:n]
    del pending[:n]
    return out


def split_expired(jobs: Sequence[J], now: float) -> tuple[list[J], list[J]]:
    live = [j for j in jobs if j.deadline > now]
    dead = [j for j in jobs if j.deadline <= now]
    return live, dead


async def _get_within(queue: asyncio.Queue[J], timeout: float) -> J | None:
    """queue.get() with a timeout that never loses an item (wait_for can, on 3.11, at the edge)."""
    task = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout))
    if done:
        return task.result()
    task.cancel()
    try:
        return await task  # it may have completed just before the cancel landed
    except asyncio.CancelledError:
        return None


IDLE_YIELDS = 3
"""Event-loop turns the batcher gives requests already received to reach the queue before it
calls the server idle: one to poll the sockets, one to run the request tasks, one to spare."""


async def _arrivals(queue: asyncio.Queue[J], pending: list[J], policy: BatchPolicy,
                    clock: Callable[[], float]) -> int:
    """Let the loop run IDLE_YIELDS turns; move what reached the queue into `pending`."""
    got = 0
    rows = sum(j.rows for j in pending)
    for _ in range(IDLE_YIELDS):
        await asyncio.sleep(0)
        while rows < policy.max_batch_size and not queue.empty():
            job = queue.get_nowait()
            job.picked_at = clock()
            pending.append(job)
            rows += job.rows
            got += 1
    return got


async def collect(queue: asyncio.Queue[J], pending: list[J], policy: BatchPolicy,
                  clock: Callable[[], float] = time.monotonic, *,
                  dispatch_when_idle: bool = False) -> Formed[J]:
    """Wait until a batch is due (or some jobs expired) and return it; `pending` carries jobs
    picked up but not yet dispatched between calls.

    With `dispatch_when_idle`, a batch that would wait for company first lets the event loop
    run a few turns (IDLE_YIELDS); if no job arrived meanwhile, no request is on its way
    through this server, and waiting out the delay would only add latency (a closed-loop
    client with 16 connections waits on this very batch), so it goes now. While requests keep
    arriving the delay applies as before."""
    while True:
        rows = sum(j.rows for j in pending)
        while rows < policy.max_batch_size and not queue.empty():
            job = queue.get_nowait()
            job.picked_at = clock()
            pending.append(job)
            rows += job.rows
        now = clock()
        live, dead = split_expired(pending, now)
        if dead:
            pending[:] = live
            return Formed(expired=dead)
        if not pending:
            job = await queue.get()
            job.picked_at = clock()
            pending.append(job)
            continue
        d = decide(rows, now - pending[0].enqueued_at, policy)
        if d.dispatch:
            return Formed(batch=take_prefix(pending, d.dispatch))
        if dispatch_when_idle and not await _arrivals(queue, pending, policy, clock):
            return Formed(batch=take_prefix(pending, policy.max_batch_size))
        if dispatch_when_idle:
            continue  # company came: decide again with it
        wait = min(d.wait_s, min(j.deadline for j in pending) - now)
        job2 = await _get_within(queue, wait)
        if job2 is not None:
            job2.picked_at = clock()
            pending.append(job2)
