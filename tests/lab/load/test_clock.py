import asyncio
import os
import time

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.clock import (
    LagRecorder,
    lag_stats,
    now,
    realtime,
    resolve_loop,
    run,
    sleep_until,
)


def test_sleep_until_never_returns_early() -> None:
    # Each due time a set offset from the moment of the call, around and past the 2 ms margin
    # spent spinning: a schedule from a fixed base falls behind on a busy machine, and every due
    # time in the past is met by returning at once (a clock returning 2 ms early passed it).
    async def go() -> list[tuple[float, float]]:
        out = []
        for i in range(30):
            due = now() + (0.0003, 0.001, 0.0019, 0.0025, 0.004, 0.0065)[i % 6]
            out.append((due, await sleep_until(due)))
        return out

    for impl in ("asyncio", "uvloop"):
        for due, woke in run(go(), impl):  # type: ignore[arg-type]
            assert woke >= due


@pytest.mark.parametrize("impl", ["asyncio", "uvloop"])
def test_sleep_until_keeps_serving_the_loop(impl: str) -> None:
    # A callback due while sleep_until waits out its last pieces still runs before it returns,
    # even when a loop turn blocks across the due time (as a preempted process does) between
    # its look at the timers and the task's read of the clock: with the clock read after the
    # yield, that ordering lost the callback every time (and one run in ten on a busy machine).
    async def go() -> bool:
        loop = asyncio.get_running_loop()
        flag = asyncio.Event()
        due = now() + 0.01
        loop.call_later(0.0092, time.sleep, 0.003)
        loop.call_later(0.0095, flag.set)
        await sleep_until(due)
        return flag.is_set()

    assert all(run(go(), impl) for _ in range(5))  # type: ignore[arg-type]


def test_lag_percentiles_are_exact_to_the_histogram() -> None:
    rec = LagRecorder()
    for us in range(1, 1001):  # 1 µs .. 1000 µs, one each
        rec.add(us * 1e-6)
    rec.add(0.0025)  # 2.5 ms: the only send over 1 ms
    rec.add(-1e-6)  # clamps to the histogram's floor (1 µs)
    s = rec.stats()
    assert s.count == 1002 and s.late == 1
    assert s.p50_ms == pytest.approx(0.5, abs=0.001)
    assert s.p99_ms == pytest.approx(0.991, abs=0.001)
    assert s.max_ms == pytest.approx(2.5, rel=0.001)
    merged = lag_stats([rec.histogram(), rec.histogram()], late=2)
    assert merged.count == 2004 and merged.p50_ms == s.p50_ms and merged.late_share == 2 / 2004
    empty = LagRecorder().stats()
    assert empty.count == 0 and empty.p99_ms is None and empty.late_share == 0.0


def test_loop_choice() -> None:
    assert resolve_loop("asyncio") == "asyncio"
    assert resolve_loop("auto") in ("asyncio", "uvloop")
    with pytest.raises(BadUsageError):
        resolve_loop("trio")  # type: ignore[arg-type]


def test_realtime_is_scoped_to_the_block() -> None:
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    try:
        with realtime():
            inside = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    except BadUsageError as e:
        assert "--realtime" in str(e)
        pytest.skip("SCHED_FIFO not permitted here")
    assert inside == (os.SCHED_FIFO, 1)
    assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before
    with realtime(False):
        assert os.sched_getscheduler(0) == before[0]
