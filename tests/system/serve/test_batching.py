"""The batching decision (exact, pure) and the batch former on a real asyncio.Queue."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import pytest

from scalelab.system.serve.batching import BatchDecision, BatchPolicy, collect, decide, take_prefix


@pytest.mark.parametrize(("rows", "waited", "max_b", "delay", "pref", "want"), [
    (0, 0.0, 8, 0.002, (), BatchDecision(dispatch=0, wait_s=math.inf)),
    (8, 0.0, 8, 0.002, (), BatchDecision(dispatch=8, wait_s=0.0)),
    (20, 0.0, 8, 0.002, (), BatchDecision(dispatch=8, wait_s=0.0)),
    (3, 0.0005, 8, 0.002, (), BatchDecision(dispatch=0, wait_s=0.0015)),
    (3, 0.002, 8, 0.002, (), BatchDecision(dispatch=3, wait_s=0.0)),
    (3, 0.5, 8, 0.002, (), BatchDecision(dispatch=3, wait_s=0.0)),
    (5, 0.0, 8, 0.002, (2, 4), BatchDecision(dispatch=4, wait_s=0.0)),
    (3, 0.0, 8, 0.002, (2, 4), BatchDecision(dispatch=0, wait_s=0.002)),
    (3, 0.002, 8, 0.002, (2, 4), BatchDecision(dispatch=2, wait_s=0.0)),
    (1, 0.002, 8, 0.002, (2, 4), BatchDecision(dispatch=1, wait_s=0.0)),
    (1, 0.0, 8, 0.0, (), BatchDecision(dispatch=1, wait_s=0.0)),
])
def test_decide_exact(rows: int, waited: float, max_b: int, delay: float,
                      pref: tuple[int, ...], want: BatchDecision) -> None:
    got = decide(rows, waited, BatchPolicy(max_batch_size=max_b, max_delay_s=delay,
                                           preferred=pref))
    assert got.dispatch == want.dispatch
    assert got.wait_s == pytest.approx(want.wait_s, abs=1e-12) or got.wait_s == want.wait_s


def test_policy_checks() -> None:
    with pytest.raises(ValueError):
        BatchPolicy(max_batch_size=0, max_delay_s=0.001)
    with pytest.raises(ValueError):
        BatchPolicy(max_batch_size=4, max_delay_s=0.001, preferred=(8,))


@dataclass(eq=False)
class J:
    rows: int = 1
    enqueued_at: float = 0.0
    deadline: float = math.inf
    picked_at: float = 0.0
    tag: int = 0


def job(tag: int = 0, rows: int = 1, deadline: float = math.inf) -> J:
    return J(rows=rows, enqueued_at=time.monotonic(), deadline=deadline, tag=tag)


def test_take_prefix_respects_rows() -> None:
    pending = [J(rows=3, tag=1), J(rows=3, tag=2), J(rows=3, tag=3)]
    assert [j.tag for j in take_prefix(pending, 8)] == [1, 2]
    assert [j.tag for j in pending] == [3]
    big = [J(rows=10, tag=9)]
    assert [j.tag for j in take_prefix(big, 4)] == [9]  # a job is never split


def test_full_batch_leaves_the_rest_queued() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue(maxsize=100)
        for i in range(10):
            q.put_nowait(job(i))
        pending: list[J] = []
        f = await collect(q, pending, BatchPolicy(max_batch_size=4, max_delay_s=10.0))
        assert [j.tag for j in f.batch] == [0, 1, 2, 3] and not f.expired
        assert q.qsize() == 6 and pending == []

    asyncio.run(go())


def test_late_arrivals_join_the_waiting_batch() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue()
        q.put_nowait(job(0))
        pending: list[J] = []
        task = asyncio.create_task(collect(q, pending, BatchPolicy(max_batch_size=4,
                                                                   max_delay_s=30.0)))
        for i in range(1, 4):
            await asyncio.sleep(0)
            q.put_nowait(job(i))
        f = await asyncio.wait_for(task, 10)
        assert [j.tag for j in f.batch] == [0, 1, 2, 3]

    asyncio.run(go())


def test_lone_job_is_dispatched_after_the_delay() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue()
        q.put_nowait(job(7))
        f = await asyncio.wait_for(collect(q, [], BatchPolicy(max_batch_size=8,
                                                              max_delay_s=0.005)), 10)
        assert [j.tag for j in f.batch] == [7]
        assert f.batch[0].picked_at >= f.batch[0].enqueued_at

    asyncio.run(go())


def test_preferred_size_goes_without_waiting() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue()
        for i in range(5):
            q.put_nowait(job(i))
        pending: list[J] = []
        f = await asyncio.wait_for(collect(q, pending, BatchPolicy(
            max_batch_size=8, max_delay_s=30.0, preferred=(2, 4))), 10)
        assert [j.tag for j in f.batch] == [0, 1, 2, 3] and [j.tag for j in pending] == [4]

    asyncio.run(go())


def test_expired_jobs_come_back_before_any_compute() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue()
        q.put_nowait(job(0, deadline=time.monotonic() - 1))
        q.put_nowait(job(1))
        pending: list[J] = []
        pol = BatchPolicy(max_batch_size=8, max_delay_s=0.001)
        f = await collect(q, pending, pol)
        assert [j.tag for j in f.expired] == [0] and f.batch == []
        f = await collect(q, pending, pol)
        assert [j.tag for j in f.batch] == [1]

    asyncio.run(go())


def test_no_job_is_lost_or_duplicated_under_a_racing_producer() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue(maxsize=16)
        n = 400

        async def produce() -> None:
            for i in range(n):
                await q.put(job(i, rows=1 + i % 3))
                if i % 7 == 0:
                    await asyncio.sleep(0.0005)

        prod = asyncio.create_task(produce())
        seen: list[int] = []
        pending: list[J] = []
        pol = BatchPolicy(max_batch_size=6, max_delay_s=0.0003, preferred=(3,))
        while len(seen) < n:
            f = await asyncio.wait_for(collect(q, pending, pol), 10)
            assert sum(j.rows for j in f.batch) <= 6 or len(f.batch) == 1
            seen += [j.tag for j in f.batch]
        await prod
        assert seen == list(range(n))

    asyncio.run(go())


def test_idle_dispatch_sends_a_lone_job_without_waiting_the_delay() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue()
        q.put_nowait(job(0))
        pending: list[J] = []
        # a delay no test would wait out: only the idle rule can return this batch
        f = await asyncio.wait_for(collect(q, pending, BatchPolicy(
            max_batch_size=8, max_delay_s=3600.0), dispatch_when_idle=True), timeout=60)
        assert [j.tag for j in f.batch] == [0] and pending == []

    asyncio.run(go())


def test_idle_dispatch_still_batches_jobs_that_are_arriving() -> None:
    async def go() -> None:
        q: asyncio.Queue[J] = asyncio.Queue()
        released = asyncio.Event()

        async def producer() -> None:
            for i in range(3):  # three arrivals one loop turn apart: all in the first batch
                q.put_nowait(job(i))
                await asyncio.sleep(0)
            await released.wait()  # then nothing until the first batch has gone
            q.put_nowait(job(3))

        task = asyncio.create_task(producer())
        pending: list[J] = []
        policy = BatchPolicy(max_batch_size=8, max_delay_s=3600.0)
        first = await collect(q, pending, policy, dispatch_when_idle=True)
        released.set()
        second = await collect(q, pending, policy, dispatch_when_idle=True)
        await task
        assert [j.tag for j in first.batch] == [0, 1, 2]
        assert [j.tag for j in second.batch] == [3]

    asyncio.run(go())
