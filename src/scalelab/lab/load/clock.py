"""When to send: one clock, a wake-up that lands on time, and the generator's lag distribution.

`now()` is CLOCK_MONOTONIC (system-wide on Linux, so processes started apart agree on it, and
nanosecond resolution). Every load part reads it, never `loop.time()`: uvloop's loop clock
advances in whole milliseconds, which would quantise every latency.

`sleep_until(t)` wakes at `t` to tens of microseconds on an idle core. The event loop alone
cannot: the selector (epoll) sleeps in whole milliseconds rounded up, and a CPU that went idle
for a long wait takes a few hundred microseconds more to wake (a VM's vCPU halts). So the
timer aims `margin_s` early and the rest is slept in short blocking pieces of at most
`piece_s`, yielding to the loop between pieces so responses keep being read; a response that
arrives during a piece is read at most `piece_s` late (its latency is overstated by that
much, never understated). A pure busy-wait would be tighter on an idle core but costs a core
per generator, and on a shared machine a spinning process is preempted more often than a
sleeping one wakes late.

On a machine busier than its cores (a shared CI box, a server under test beside the generator)
the wake-up itself is the problem: a runnable generator waits its turn behind every other
runnable process, milliseconds at a load average of several per core. `realtime()` puts the
generator in the SCHED_FIFO class for the run (opt-in, `--realtime`; Linux, needs root or
CAP_SYS_NICE): it then runs the moment it wakes. Measured on the 2-core development VM at load
average 17: lag p99 at 1,000 req/s 8.3 ms without, 0.03 ms with. What it costs: while the
generator runs, nothing of normal priority runs on that core, so a generator asked for more
than it can send holds a core (the kernel's RT throttling still leaves 5% to others).

`LagRecorder` keeps every measured send's lateness (send time − due time) in microseconds,
summarised as `LagStats` (p50/p99/max) and shipped across processes as an HdrHistogram blob.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from array import array
from collections.abc import Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.histogram import LatencyHistogram

now = time.monotonic
"""The load parts' clock: seconds on CLOCK_MONOTONIC."""

MARGIN_S = 0.002
"""The loop's timer aims this far before the due time (ms rounding + wake-up latency)."""
PIECE_S = 0.0002
"""Longest blocking sleep between two looks at the sockets."""
LATE_S = 0.001
"""A send more than this late is counted apart (`LagStats.late`), as before p50/p99 existed."""

LoopImpl = Literal["auto", "asyncio", "uvloop"]
LOOP_IMPLS: tuple[LoopImpl, ...] = ("auto", "asyncio", "uvloop")
T = TypeVar("T")


async def sleep_until(when: float, *, margin_s: float = MARGIN_S,
                      piece_s: float = PIECE_S) -> float:
    """Return at `when` (seconds on `now()`) or just after; returns the time it woke.

    Costs one loop timer per call plus at most (margin_s / piece_s) + 1 short sleeps, each
    after a zero-timeout look at the sockets; it always yields to the loop at least twice.
    """
    loop = asyncio.get_running_loop()
    wait = when - now()
    if wait > margin_s:
        fut: asyncio.Future[None] = loop.create_future()
        handle = loop.call_later(wait - margin_s, _wake, fut)
        try:
            await fut
        finally:
            handle.cancel()
    # Whatever fell due before `when` (responses, timers) has run by the time this returns.
    # A loop turn queues what is due at its look behind this task's own step, so the clock is
    # read before the yield (that turn looks at or after `t`) and, once `t` is past `when`,
    # one more yield runs what it queued. Reading the clock after the yield instead let a
    # callback slip by whenever the process was preempted between the look and the read
    # (one run in ten with both cores busy): the look was early, the read late. The extra turn
    # costs ~1 us a call on uvloop, ~2.3 us on asyncio.
    while True:
        t = now()
        await asyncio.sleep(0)
        if t >= when:
            await asyncio.sleep(0)
            return now()
        rest = when - now()
        if rest > 0:
            time.sleep(min(rest, piece_s))


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def uvloop_available() -> bool:
    """True when uvloop can be imported (it comes with the `serve` extra)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_loop(impl: LoopImpl) -> Literal["asyncio", "uvloop"]:
    """The loop `impl` means here: "auto" is uvloop when installed, else asyncio."""
    if impl not in LOOP_IMPLS:
        raise BadUsageError(f"--event-loop must be one of {', '.join(LOOP_IMPLS)}, got {impl!r}")
    if impl == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    if impl == "uvloop" and not uvloop_available():
        raise BadUsageError("--event-loop uvloop: uvloop is not installed; pip install "
                            "'scalelab[serve]' (or uvloop), or use --event-loop asyncio")
    return impl


def run(coro: Coroutine[Any, Any, T], impl: LoopImpl = "auto") -> T:
    """`asyncio.run(coro)` on the chosen event loop implementation."""
    if resolve_loop(impl) == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


@contextlib.contextmanager
def realtime(enabled: bool = True) -> Iterator[None]:
    """Run the block in SCHED_FIFO (priority 1) when `enabled`, then restore the old policy."""
    if not enabled:
        yield
        return
    if not sys.platform.startswith("linux"):
        raise BadUsageError("--realtime needs Linux (SCHED_FIFO); drop --realtime")
    old_policy = os.sched_getscheduler(0)
    old_param = os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        raise BadUsageError("--realtime: not permitted to use SCHED_FIFO (run as root, grant "
                            "CAP_SYS_NICE, or raise RLIMIT_RTPRIO), or drop --realtime") from None
    try:
        yield
    finally:
        os.sched_setscheduler(0, old_policy, old_param)


@dataclass(frozen=True, kw_only=True)
class LagStats:
    """How late the generator sent, over one level's measured sends (milliseconds)."""

    count: int
    """Sends measured."""
    p50_ms: float | None
    """Median lateness (None when nothing was sent)."""
    p99_ms: float | None
    """99th percentile lateness."""
    max_ms: float | None
    """Worst lateness."""
    late: int
    """Sends more than `LATE_S` late."""

    @property
    def late_share(self) -> float:
        return self.late / self.count if self.count else 0.0


class LagRecorder:
    """Lateness of each measured send, appended in the hot path (~50 ns) as integer µs."""

    def __init__(self) -> None:
        self._us = array("q")
        self.late = 0

    def add(self, late_s: float) -> None:
        if late_s > LATE_S:
            self.late += 1
        # Early (negative) sends cannot happen with sleep_until; clamp to 0 to be sure.
        self._us.append(round(late_s * 1e6) if late_s > 0 else 0)

    def __len__(self) -> int:
        return len(self._us)

    def histogram(self) -> LatencyHistogram:
        """As an HdrHistogram in µs (values under 1 µs count as 1 µs)."""
        h = LatencyHistogram()
        h.record_us(np.frombuffer(self._us, dtype=np.int64))
        return h

    def stats(self) -> LagStats:
        return lag_stats([self.histogram()], late=self.late)


def lag_stats(hists: Iterable[LatencyHistogram], *, late: int) -> LagStats:
    """Merge per-process lag histograms into one `LagStats`."""
    merged = LatencyHistogram()
    for h in hists:
        merged.merge(h)
    if merged.count == 0:
        return LagStats(count=0, p50_ms=None, p99_ms=None, max_ms=None, late=late)
    return LagStats(count=merged.count, p50_ms=merged.quantile_ms(0.5),
                    p99_ms=merged.quantile_ms(0.99), max_ms=merged.max_ms(), late=late)
