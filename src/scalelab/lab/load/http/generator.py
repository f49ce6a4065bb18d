"""The load generator: open loop (requests due on a schedule) or closed loop (N clients).

Open loop: a dispatcher walks the arrival schedule and hands each due request to an idle
keep-alive connection, opening more (up to `max_connections`) when none is idle; latency is timed
from the request's *due* time, so time spent waiting for the server, for a connection, or for a
late generator all count (no coordinated omission). How late each request got its connection
(the dispatcher woke late, or every connection was busy at the cap) is generator lag: every
measured send's lag is kept (p50/p99/max, merged across processes), and `result.validity`
judges from it and the achieved send rate whether the offered load was the one asked for.
The dispatcher wakes with `clock.sleep_until`, on time to tens of microseconds on an idle core.

Closed loop: `concurrency` connections, each sending its next request when the previous one
returns. It measures service time under a fixed number of outstanding requests, and by design
hides a stalled server: a client stuck behind the stall sends nothing, so the stall is one slow
sample per client instead of rate × stall slow samples.

The schedule, warm-up, window, lag, stop checks and counts are `driver.Driver`'s, shared with
the streaming driver; what is HTTP's own here is the exchange (a response completes in the
connection's callback, no task per request), the pool with its pending queue at the cap, the
per-request timeout sweep, the cold-start probe and the CPU accounting. One process runs one
asyncio loop; `level.py` runs several and `http/result.py` merges their `HttpPart`s.
"""

from __future__ import annotations

import asyncio
import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.lab.core.usage import busy_cores, busy_ticks, sched_times
from scalelab.lab.load.capacity import Progress
from scalelab.lab.load.clock import LoopImpl, now
from scalelab.lab.load.driver import Driver
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.http.connection import Connection, HttpConnection, ProtocolError
from scalelab.lab.load.pool import Pool
from scalelab.lab.load.result import Part
from scalelab.lab.load.send import SendConfig
from scalelab.lab.load.slices import slice_blobs
from scalelab.lab.load.steady import SteadyTrace, trace_of

ERROR_KINDS = ("status", "timeout", "refused", "reset", "protocol", "tls", "other")
MAX_OPENING = 256
"""Connects in flight at most, so a burst cannot exhaust the listen backlog."""


def _os_kind(e: OSError) -> str:
    """A connect's failure: a TLS handshake the server refused (bad certificate, HTTP/2 only
    by ALPN) is "tls", anything else "other"."""
    import ssl

    return "tls" if isinstance(e, ssl.SSLError | ssl.CertificateError) else "other"


@dataclass(kw_only=True)
class HttpPart(Part):
    """One process's measurements; plain values so it pickles across processes."""

    within: int = 0
    hist_blob: str = ""
    lag_max_s: float = 0.0
    last_due: float = 0.0
    pool_waits: int = 0
    cold_start_s: float | None = None
    cold_start_error: str | None = None
    cpu_s: float = 0.0
    """Seconds the loop's thread ran on a CPU from the start to the end of the run."""
    cpu_wait_s: float | None = None
    """Seconds it was ready to run but waited for a CPU (None: the kernel keeps no schedstat)."""
    cpu_span_s: float = 0.0
    """Wall seconds those two cover."""
    machine_busy_cores: float | None = None
    """Busy cores of the whole machine over the same span (/proc/stat), this process included."""
    steady: SteadyTrace | None = None
    """Open loop: what the steady-state tests of a capacity step read (`load.steady`)."""
    slice_blobs: list[str] = field(default_factory=list)
    """The measured latencies in `load.slices.SLICES` consecutive slices (histogram blobs)."""


@dataclass(kw_only=True)
class HttpConfig(SendConfig):
    """How one process drives plain HTTP load (the CLI builds it; validated here)."""

    slo_threshold_s: float | None = None
    """Count successes at or under this latency (goodput)."""
    loop_impl: LoopImpl = "auto"
    """Event loop: uvloop when installed ("auto"), or plain asyncio."""
    realtime: bool = False
    """Run the generator in SCHED_FIFO (see `clock.realtime`): precise on a busy machine."""


class HttpDriver(Driver[HttpPart, Progress]):
    """One asyncio loop's worth of plain HTTP load: `Driver`'s schedule over keep-alive
    connections, a response completing in the connection's callback (no task per request)."""

    tick_s = 0.05
    """The watcher also fails requests past their timeout: it wakes 20 times a second."""

    def __init__(self, cfg: HttpConfig) -> None:
        super().__init__(cfg, HttpPart())
        self.cfg: HttpConfig = cfg
        self.hist = LatencyHistogram()
        # Latencies in µs, appended in the hot path (~50 ns) and put into the histogram once at
        # the end (a histogram update costs ~3 µs in Python); 8 bytes per measured request.
        self._lat_us = array("q")
        # Due times of the same successes (8 bytes each): latency against time, for the
        # steady-state test of a capacity step (`load.steady`).
        self._due_ok = array("d")
        # Completion times of every success, warm-up included (8 bytes each): the served rate
        # inside the window, whatever requests the server was busy with.
        self._done_t = array("d")
        # Waiting: (due, measured, capped); capped entries found every connection busy at the cap.
        self._pool: Pool[Connection, tuple[float, bool, bool]] = Pool(cfg.max_connections)
        self._timed_out: set[Connection] = set()
        self._outstanding = 0
        self._dispatching = True
        self._done = asyncio.Event()
        self._thr = cfg.slo_threshold_s if cfg.slo_threshold_s is not None else math.inf
        self._cpu0: tuple[float, tuple[float, float] | None, tuple[int, int, int] | None] = (
            now(), None, None)

    # ---- responses and failures (hot path) ----

    def _on_response(self, conn: Connection, status: int, token: Any, now: float) -> None:
        due, measured = token
        self._outstanding -= 1
        if 200 <= status < 300:
            self._done_t.append(now)
        if measured:
            res = self.res
            res.last_done = now
            if 200 <= status < 300:
                lat = now - due
                self._lat_us.append(int(lat * 1e6))
                self._due_ok.append(due)
                res.ok += 1
                if lat <= self._thr:
                    res.within += 1
            else:
                self.status[str(status)] += 1
                self.kinds["status"] += 1
                self._retry_after(conn)
        else:
            self.res.warmup_requests += 1
        self._next(conn)

    def _next(self, conn: Connection) -> None:
        if conn.closed:
            return
        if self.cfg.mode == "closed":
            if self._closed_send(conn):
                return
            self._pool.idle.append(conn)
        else:
            waiting = self._pool.hand_off(conn)
            if waiting is not None:
                due, measured, capped = waiting
                if capped:
                    self._count_send(due, measured, now())
                self._send(conn, due, measured)
                return
        self._check_done()

    def _send(self, conn: Connection, due: float, measured: bool) -> None:
        conn.send(self._next_request(measured), (due, measured))

    def _fail(self, kind: str, measured: bool, detail: BaseException | str | None = None
              ) -> None:
        self._outstanding -= 1
        super()._fail(kind, measured, detail)

    def _retry_after(self, conn: Connection) -> None:
        ra = getattr(conn, "retry_after", None)
        if ra is not None:
            res = self.res
            res.retry_after_count += 1
            res.retry_after_max_s = max(res.retry_after_max_s or 0.0, ra)
            conn.retry_after = None  # type: ignore[attr-defined]

    def _on_lost(self, conn: Connection, exc: BaseException | None, token: Any) -> None:
        self._pool.lost(conn)
        if conn.by_server:
            self.res.server_closes += 1
        if token is not None:
            _, measured = token
            timed_out = conn in self._timed_out
            if conn.retryable and not timed_out:
                # Closed idle as we sent, before any byte of an answer: once more, fresh.
                self.res.retries += 1
                self._pool.opening += 1
                self.loop.create_task(self._open((conn.request, token)))
            else:
                if timed_out:
                    kind = "timeout"
                elif isinstance(exc, ProtocolError):
                    kind = "protocol"
                elif exc is None or isinstance(exc, ConnectionResetError | BrokenPipeError):
                    kind = "reset"
                else:
                    kind = "other"
                self._fail(kind, measured, exc)
        self._timed_out.discard(conn)
        self._refill()
        self._check_done()

    def _refill(self) -> None:
        """Open connections for waiting work (open loop) or to keep N clients (closed loop)."""
        pool = self._pool
        if self.cfg.mode == "closed":
            want = self.cfg.concurrency if self.can_send() else 0
            while len(pool.conns) + pool.opening < want and pool.opening < MAX_OPENING:
                pool.opening += 1
                self.loop.create_task(self._open())
            return
        # Waiting requests mean no connection is idle: open one per waiting request, up to
        # the cap.
        while (pool.opening < len(pool.waiting) and pool.opening < MAX_OPENING
               and pool.has_room()):
            pool.opening += 1
            self.loop.create_task(self._open())

    async def _connect(self, on_response: Callable[..., None],
                       on_lost: Callable[..., None]) -> Connection:
        """A connection to the target: TCP for http(s), a gRPC channel for grpc://."""
        cfg = self.cfg
        if cfg.target.scheme == "grpc":
            from scalelab.lab.load.http.grpc_client import GrpcConnection

            return await GrpcConnection.connect(cfg.target, on_response, on_lost, now,
                                                cfg.timeout_s)
        _, conn = await asyncio.wait_for(
            self.loop.create_connection(lambda: HttpConnection(on_response, on_lost, now),
                                        cfg.target.host, cfg.target.port,
                                        ssl=cfg.target.ssl_context()),
            timeout=cfg.timeout_s)
        return conn

    async def _open(self, retry: tuple[bytes, Any] | None = None) -> None:
        """Open a connection for the next work, or to send `retry` (request, token) again."""
        try:
            conn = await self._connect(self._on_response, self._on_lost)
        except ConnectionRefusedError as e:
            self._pool.open_failed()
            self._connect_failed("refused", retry, e)
            return
        except TimeoutError as e:
            self._pool.open_failed()
            self._connect_failed("timeout", retry, e)
            return
        except OSError as e:
            self._pool.open_failed()
            self._connect_failed(_os_kind(e), retry, e)
            return
        self._pool.opened(conn)
        self.res.connections_opened += 1
        if retry is not None:
            conn.send(*retry)
            return
        self._next(conn)

    def _connect_failed(self, kind: str, retry: tuple[bytes, Any] | None,
                        exc: BaseException) -> None:
        if retry is not None:
            self._fail(kind, retry[1][1], exc)
            self._refill()
        elif self.cfg.mode == "open":
            waiting = self._pool.first_waiter()
            if waiting is not None:
                self._fail(kind, waiting[1], exc)
            self._refill()
        elif self.can_send():
            # A client that cannot connect counts one failed request, then retries shortly.
            t = now()
            self._outstanding += 1
            self._fail(kind, t >= self.warm_end, exc)
            self._count_closed_send(t >= self.warm_end)
            self.loop.call_later(0.01, self._refill)
        self._check_done()

    def _check_done(self) -> None:
        if not self._dispatching and self._outstanding == 0:
            self._done.set()

    # ---- open loop ----

    def _count_send(self, due: float, measured: bool, now: float) -> None:
        """Lag is judged when a request gets a connection (idle, or one opened for it)."""
        if measured:
            self._lagged(due, now)
            res = self.res
            late = now - due
            if late > res.lag_max_s:
                res.lag_max_s = late
            if due > res.last_due:
                res.last_due = due

    def _dispatch(self, due: float, measured: bool, woke: float) -> None:
        self._outstanding += 1
        pool = self._pool
        conn = pool.take_idle()
        if conn is not None:
            self._count_send(due, measured, now())
            self._send(conn, due, measured)
            return
        if pool.has_room():
            self._count_send(due, measured, now())
            pool.waiting.append((due, measured, False))
            self._refill()
        else:
            # Every connection is busy at the cap: the wait for one is generator lag.
            pool.waiting.append((due, measured, True))
            self.res.pool_waits += 1

    # ---- closed loop ----

    def _closed_send(self, conn: Connection) -> bool:
        if not self.can_send():
            return False
        t = now()
        measured = t >= self.warm_end
        self._count_closed_send(measured)
        if measured:
            self.res.last_send = t
        self._outstanding += 1
        self._send(conn, t, measured)
        return True

    async def _clients(self) -> None:
        cfg = self.cfg
        idle, self._pool.idle = self._pool.idle, []
        for conn in idle[: cfg.concurrency]:
            self._next(conn)
        for conn in idle[cfg.concurrency:]:
            conn.abort()
        self._refill()
        while self.can_send() or self._pool.opening:
            await asyncio.sleep(0.02)

    # ---- shared ----

    async def cold_start(self) -> None:
        """Time the first request on a fresh connection (connect + response), apart from results."""
        fut: asyncio.Future[float] = self.loop.create_future()
        t0 = now()

        def on_resp(conn: Connection, status: int, token: object, now: float) -> None:
            if not fut.done():
                if 200 <= status < 300:
                    fut.set_result(now - t0)
                else:
                    fut.set_exception(RuntimeError(f"HTTP {status}"))
            conn.abort()

        def on_lost(conn: Connection, exc: BaseException | None, token: object) -> None:
            if not fut.done():
                fut.set_exception(RuntimeError(f"connection closed: {exc!r}"))

        try:
            conn = await self._connect(on_resp, on_lost)
            conn.send(self.cfg.requests[0], (t0, False))
            self.res.cold_start_s = await asyncio.wait_for(fut, timeout=self.cfg.timeout_s)
        except (OSError, RuntimeError, TimeoutError) as e:
            self.res.cold_start_error = f"{type(e).__name__}: {e}"

    def _on_tick(self, t: float) -> None:
        """Fail requests past their timeout."""
        timeout = self.cfg.timeout_s
        waiting = self._pool.waiting
        while waiting and t - waiting[0][0] > timeout:
            due, measured, capped = waiting.popleft()
            if capped:
                self._count_send(due, measured, t)
            self._fail("timeout", measured)
        for conn in list(self._pool.conns):
            tok = conn.token
            if tok is not None and t - tok[0] > timeout and conn not in self._timed_out:
                self._timed_out.add(conn)
                conn.abort()
        self._check_done()

    def _progress(self) -> Progress:
        res = self.res
        return Progress(sent=res.sent, ok=res.ok, errors=sum(self.kinds.values()),
                        within=res.within)

    async def _drain(self) -> None:
        self._dispatching = False
        self._check_done()
        # The watcher fails anything past its timeout, so this ends within timeout + a tick.
        await asyncio.wait_for(self._done.wait(), timeout=self.cfg.timeout_s + 5.0)

    def _close_all(self) -> None:
        for conn in self._pool.clear():
            conn.close()

    def _on_start(self) -> None:
        # Whether the generator was starved of CPU decides what a late run's reason advises.
        self._cpu0 = (now(), sched_times(), busy_ticks())

    def _cpu_stop(self) -> None:
        t0, s0, b0 = self._cpu0
        s1, res = sched_times(), self.res
        res.cpu_span_s = now() - t0
        if s0 is not None and s1 is not None:
            res.cpu_s, res.cpu_wait_s = s1[0] - s0[0], s1[1] - s0[1]
        res.machine_busy_cores = busy_cores(b0, busy_ticks())

    def _finish(self) -> HttpPart:
        self._cpu_stop()
        res = super()._finish()
        lat_us = np.frombuffer(self._lat_us, dtype=np.int64)
        if self.cfg.mode == "open":
            res.steady = trace_of(res.window_start, res.last_due,
                                  np.frombuffer(self._due_ok, dtype=np.float64), lat_us / 1e6,
                                  np.frombuffer(self._done_t, dtype=np.float64), res.sent)
        self._due_ok = array("d")
        self.hist.record_us(lat_us)
        res.slice_blobs = slice_blobs(lat_us)
        self._lat_us = array("q")
        res.hist_blob = self.hist.encode()
        window = self._window()
        if window is not None:
            t0, t1 = window
            res.served_in_window = sum(1 for t in self._done_t if t0 <= t <= t1)
        self._done_t = array("d")
        return res
