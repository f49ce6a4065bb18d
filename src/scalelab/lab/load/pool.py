"""The connection pool under both load drivers: connections to one target up to a cap.

One idea, two waiting policies. What the pool keeps is the same for a plain HTTP request and for
an SSE stream: the open connections, how many connects are under way (both count against
`cap`), the idle ones, and the requests waiting because every connection is busy, in arrival
order; a connection that frees up goes to the first of them, else back to idle (`hand_off`).
How a request waits is the protocol's:
- the queue (`Pool`, HTTP's): a waiting request is an entry that the next connection to free
  up, or the next one opened for it, takes in its callback: no task per request, HTTP's hot
  path. The driver opens one connection per waiting request (`http/generator.py`).
- the future (`FuturePool`, streams'): the request's task awaits a future that a released
  connection resolves (`acquire` / `release`); under the cap it opens its own connection. A
  waiter whose task gave up (timed out) is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar


class Conn(Protocol):
    """What the pool needs of a connection."""

    closed: bool

    def abort(self) -> None: ...


C = TypeVar("C", bound=Conn)
W = TypeVar("W")


class Pool(Generic[C, W]):
    """Connections up to `cap` and the requests (`W`) waiting for one, first come first served."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.conns: set[C] = set()
        """Every open connection, busy or idle."""
        self.idle: list[C] = []
        self.opening = 0
        """Connects under way."""
        self.waiting: deque[W] = deque()

    def has_room(self) -> bool:
        """Another connect stays within the cap."""
        return len(self.conns) + self.opening < self.cap

    def opened(self, conn: C) -> None:
        """A connect under way succeeded."""
        self.opening -= 1
        self.conns.add(conn)

    def open_failed(self) -> None:
        self.opening -= 1

    def lost(self, conn: C) -> None:
        """`conn` closed: it leaves the pool."""
        self.conns.discard(conn)
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def take_idle(self) -> C | None:
        """An idle connection still open, or None."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self.conns.discard(conn)
        return None

    def hand_off(self, conn: C) -> W | None:
        """`conn` is free: the first waiting request to serve on it, or None (it is idle now)."""
        w = self.first_waiter() if self.waiting else None
        if w is None:
            self.idle.append(conn)
        return w

    def has_waiter(self) -> bool:
        return any(self._live(w) for w in self.waiting)

    def first_waiter(self) -> W | None:
        """Take the first waiting request that still wants a connection, or None."""
        while self.waiting:
            w = self.waiting.popleft()
            if self._live(w):
                return w
        return None

    def clear(self) -> list[C]:
        """Empty the pool; returns its connections for the caller to close."""
        out = list(self.conns | set(self.idle))
        self.conns.clear()
        self.idle.clear()
        return out

    def _live(self, w: W) -> bool:
        """Whether waiter `w` still wants a connection."""
        return True


class FuturePool(Pool[C, "asyncio.Future[C]"]):
    """`Pool` whose waiting requests are tasks awaiting a future: `acquire` a connection, hold
    it for the whole exchange, `release` it."""

    def __init__(self, cap: int, *, connect: Callable[[], Coroutine[Any, Any, C]],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        super().__init__(cap)
        self._connect = connect
        self._spawn = spawn

    async def acquire(self, *, fresh: bool = False) -> tuple[C, bool]:
        """A connection, and whether getting it meant waiting for one at the cap; `fresh`:
        a newly opened one where the cap allows (a resend after an idle close)."""
        conn = None if fresh and self.has_room() else self.take_idle()
        if conn is not None:
            return conn, False
        if self.has_room():
            self.opening += 1
            try:
                conn = await self._connect()
            except BaseException:
                self.open_failed()
                raise
            self.opened(conn)
            return conn, False
        fut: asyncio.Future[C] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        return await fut, True

    def release(self, conn: C, *, reusable: bool = True) -> None:
        """The exchange on `conn` ended; a connection that cannot carry another is closed and,
        when a request waits, replaced by a fresh one."""
        if conn.closed or not reusable:
            conn.abort()
            self.lost(conn)
            if self.has_waiter():
                self.opening += 1
                self._spawn(self._open_for_waiter())
            return
        w = self.hand_off(conn)
        if w is not None:
            w.set_result(conn)

    async def _open_for_waiter(self) -> None:
        try:
            conn = await self._connect()
        except OSError as e:
            self.open_failed()
            w = self.first_waiter()
            if w is not None:
                w.set_exception(e)
            return
        self.opened(conn)
        self.release(conn)

    def _live(self, w: asyncio.Future[C]) -> bool:
        return not w.done()
