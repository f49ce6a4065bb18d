"""The connection pool (`load/pool.py`): the cap, the hand-off order, and the two waiting policies.

The drivers run it against real servers (test_generator.py, test_llm_stream.py); this pins the
bookkeeping with plain connection objects, and that the pool is whole after a failed connect.
"""

from __future__ import annotations

import asyncio

import pytest

from scalelab.lab.load.pool import FuturePool, Pool


class Conn:
    """A connection as the pool sees it: open or closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.aborts = 0

    def abort(self) -> None:
        self.aborts += 1
        self.closed = True


def _opening_pool(opened: list[Conn]) -> FuturePool[Conn]:
    """A one-connection FuturePool whose connects open `c0`, `c1`, ... into `opened` and whose
    spawned reconnects run as tasks (call inside a running loop)."""
    tasks: set[asyncio.Task[None]] = set()

    async def connect() -> Conn:
        opened.append(Conn(f"c{len(opened)}"))
        return opened[-1]

    return FuturePool(1, connect=connect, spawn=lambda c: tasks.add(asyncio.create_task(c)))


def test_queue_pool_hands_a_free_connection_to_the_first_waiter() -> None:
    pool: Pool[Conn, str] = Pool(2)
    a, b = Conn("a"), Conn("b")
    pool.opening = 2
    assert not pool.has_room()
    pool.opened(a)
    pool.opened(b)
    assert pool.conns == {a, b} and pool.opening == 0 and not pool.has_room()
    pool.waiting.extend(["r1", "r2"])
    assert pool.hand_off(a) == "r1" and pool.hand_off(b) == "r2"
    assert pool.idle == []
    # Nobody waits: the connection is idle, and taken back from there.
    assert pool.hand_off(a) is None and pool.idle == [a]
    assert pool.take_idle() is a and pool.idle == []


def test_queue_pool_drops_closed_and_lost_connections() -> None:
    pool: Pool[Conn, str] = Pool(3)
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    for conn in (a, b, c):
        pool.opening += 1
        pool.opened(conn)
        assert pool.hand_off(conn) is None
    b.abort()
    # The last idle one first; a closed one found on the way leaves the pool.
    assert pool.take_idle() is c
    pool.lost(a)
    assert pool.conns == {b, c} and pool.idle == [b]
    assert pool.take_idle() is None
    assert pool.conns == {c} and pool.has_room()
    pool.opening += 1
    pool.open_failed()
    assert pool.opening == 0 and pool.clear() == [c] and not pool.conns and not pool.idle


def test_future_pool_waits_at_the_cap_and_skips_a_waiter_that_gave_up() -> None:
    opened: list[Conn] = []

    async def go() -> None:
        pool = _opening_pool(opened)
        first, waited = await pool.acquire()
        assert first is opened[0] and not waited
        gave_up = asyncio.create_task(pool.acquire())
        second = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        assert len(pool.waiting) == 2
        gave_up.cancel()
        await asyncio.sleep(0)
        pool.release(first)
        assert await second == (first, True)
        assert not pool.waiting and pool.idle == []
        pool.release(first)
        assert pool.idle == [first] and len(opened) == 1

    asyncio.run(go())


def test_future_pool_replaces_a_broken_connection_for_a_waiter() -> None:
    opened: list[Conn] = []

    async def go() -> None:
        pool = _opening_pool(opened)
        first, _ = await pool.acquire()
        waiter = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        pool.release(first, reusable=False)  # the stream was cut mid-answer
        assert first.closed and first not in pool.conns and pool.opening == 1
        conn, waited = await waiter
        assert conn is opened[1] and waited
        assert pool.conns == {conn} and pool.opening == 0

    asyncio.run(go())


def test_future_pool_is_whole_after_a_failed_connect() -> None:
    async def refused() -> Conn:
        raise ConnectionRefusedError("refused")

    async def go() -> None:
        pool = FuturePool(1, connect=refused, spawn=lambda c: None)
        for _ in range(3):
            with pytest.raises(ConnectionRefusedError):
                await pool.acquire()
            assert pool.opening == 0 and not pool.conns and pool.has_room()

    asyncio.run(go())


def test_future_pool_passes_a_failed_reconnect_to_the_waiter() -> None:
    calls = 0

    async def connect() -> Conn:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise ConnectionRefusedError("the server went away")
        return Conn("c0")

    async def go() -> None:
        tasks: set[asyncio.Task[None]] = set()
        pool = FuturePool(1, connect=connect, spawn=lambda c: tasks.add(asyncio.create_task(c)))
        first, _ = await pool.acquire()
        waiter = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        pool.release(first, reusable=False)
        with pytest.raises(ConnectionRefusedError):
            await waiter
        assert pool.opening == 0 and not pool.conns and not pool.waiting and pool.has_room()

    asyncio.run(go())
