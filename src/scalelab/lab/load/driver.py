"""The load driver: one spine for every protocol's arrival schedule, window and counts.

A driver is one asyncio loop's worth of load. What it owns is the same for a plain HTTP
request and for an SSE token stream:
- the arrival schedule: open loop (request i due at `start_at + times[i]`, dispatched by a loop
  that wakes with `clock.sleep_until`) or closed loop (`concurrency` clients, while the
  duration and request count allow);
- the warm-up and the measured window (`Part.window_start`), the sent and failure counts;
- dispatch lag (`clock.LagRecorder`, judged when a request gets its connection) and the last
  send, from which `result` judges the level's validity;
- the stopping rule (`StopCheck`: one signature for every protocol, called with the
  protocol's `_progress` snapshot), asked every `STOP_CHECK_S` (0.1 s) at most, and the end:
  drain, close, fill in the part;
- the requests' rotation and `--trace-sample` marking.

What a protocol adds (a subclass: `http.generator.HttpDriver`, `llm.stream.StreamDriver`) is
the exchange and its connections: `_dispatch` hands one due request to the protocol,
`_clients` runs the closed loop's clients, `_progress` is what its stopping rule reads,
`_drain` waits for what is in flight and `_close_all` closes the pool. Both pools are
`pool.Pool`, differing in how a request waits for a connection at the cap: the HTTP
exchange is callback-driven over `http/connection.py` (a response completes in the protocol's
callback, no task per request: its hot path) and a waiting request is a queued entry; the
streaming one is a coroutine per request over `llm/sse.py` (a stream lasts seconds) that
awaits a future.
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections import defaultdict
from collections.abc import Callable
from typing import ClassVar, Generic, TypeAlias, TypeVar

from scalelab.lab.load.clock import LagRecorder, now, sleep_until
from scalelab.lab.load.result import Part
from scalelab.lab.load.send import SendConfig
from scalelab.lab.load.trace_sample import TraceSampler

PartT = TypeVar("PartT", bound=Part)
ProgressT = TypeVar("ProgressT")
StopCheck: TypeAlias = Callable[[ProgressT, float], bool]
"""The stopping rule: (what the step measured so far, seconds since the measured window
opened) -> stop now. `capacity.StopRule.should_stop` is one."""
TICK_S = 0.5
"""How often the watcher wakes unless the protocol wants more (HTTP: 20 times a second)."""
STOP_CHECK_S = 0.1
"""How often the stopping rule is asked at most (never more often than the watcher wakes).
Asking costs ~13 µs (two Clopper-Pearson bounds), so it may be asked often: asked twice a
second, with its asks falling ~0.05 s before the step's `min_step_s` floor, a capacity step
that could stop at its 1 s floor ran 1.46 s (the serve stage's searches, issue #34)."""


class Driver(abc.ABC, Generic[PartT, ProgressT]):
    """One asyncio loop's worth of load, measured into a `PartT`, its stopping rule reading a
    `ProgressT`. Use `run_open` or `run_closed` once."""

    tick_s: ClassVar[float] = TICK_S
    """How often the watcher wakes (`_on_tick`); the stopping rule is asked every
    `STOP_CHECK_S` of it (every wake where a wake is longer)."""

    def __init__(self, cfg: SendConfig, res: PartT) -> None:
        self.cfg = cfg
        self.loop = asyncio.get_running_loop()
        self.res = res
        self.lag = LagRecorder()
        self.kinds: defaultdict[str, int] = defaultdict(int)
        """Measured failures by kind."""
        self.status: defaultdict[str, int] = defaultdict(int)
        """Measured non-2xx answers by status."""
        self.tracer = (TraceSampler(cfg.trace_sample, seed=cfg.trace_seed)
                       if cfg.trace_sample > 0 else None)
        self.warm_end = 0.0
        """When the measured window opens (the loop clock)."""
        self.closed_end = math.inf
        self.closed_left: int | None = None
        self.stop_requested = False
        self.stopped_at: float | None = None
        """When the schedule stopped early (the stopping rule, or a stop from outside)."""
        self._next_req = 0
        self._nreq = len(cfg.requests)

    # ---- what the protocol supplies ----

    @abc.abstractmethod
    def _dispatch(self, due: float, measured: bool, woke: float) -> None:
        """Open loop: start the request due at `due` (the dispatcher woke at `woke`)."""

    @abc.abstractmethod
    async def _clients(self) -> None:
        """Closed loop: run the clients until `can_send` turns False."""

    @abc.abstractmethod
    def _progress(self) -> ProgressT:
        """The measurements so far, as the protocol's stopping rule reads them."""

    @abc.abstractmethod
    async def _drain(self) -> None:
        """Wait for every request in flight to end (each ends by its own timeout)."""

    @abc.abstractmethod
    def _close_all(self) -> None:
        """Close the connections and anything still running."""

    def _on_start(self) -> None:
        """The schedule starts now (after the wait for `start_at`)."""

    def _on_tick(self, t: float) -> None:
        """The watcher woke at `t`."""

    # ---- shared by the protocols ----

    def _next_request(self, measured: bool) -> bytes:
        """The next of `cfg.requests` in rotation, marked when sampled for tracing."""
        req = self.cfg.requests[self._next_req]
        self._next_req = (self._next_req + 1) % self._nreq
        # `_traced` inlined: this runs once per request on HTTP's hot path.
        if self.tracer is not None and measured:
            return self.tracer.mark(req)
        return req

    def _traced(self, req: bytes, measured: bool) -> bytes:
        if self.tracer is not None and measured:
            return self.tracer.mark(req)
        return req

    def _lagged(self, due: float, t: float) -> None:
        """A measured request due at `due` got its connection at `t`: that wait is lag. The
        connect itself is the network's time and shows in the latency, not in the lag."""
        self.lag.add(t - due)
        if t > self.res.last_send:
            self.res.last_send = t

    def _fail(self, kind: str, measured: bool,
              detail: BaseException | str | None = None) -> None:
        if measured:
            self.kinds[kind] += 1
            self.res.last_done = now()
            if detail is not None and kind not in self.res.error_examples:
                # The first failure of each kind, as said: the likely cause a run whose every
                # request failed prints (`result.likely_cause`).
                text = detail if isinstance(detail, str) else \
                    (str(detail) or type(detail).__name__)
                self.res.error_examples[kind] = text[:300]
        else:
            self.res.warmup_requests += 1

    def can_send(self) -> bool:
        """Closed loop: the duration, the request count and the stopping rule allow another."""
        if self.stop_requested or now() >= self.closed_end:
            return False
        return self.closed_left is None or self.closed_left > 0

    def _count_closed_send(self, measured: bool) -> None:
        if measured:
            self.res.sent += 1
            if self.closed_left is not None:
                self.closed_left -= 1

    # ---- the two schedules ----

    async def run_open(self, times: list[float], start_at: float,
                       stop_check: StopCheck[ProgressT] | None = None) -> PartT:
        """Send request i at `start_at + times[i]` (on `clock.now`); measure those due after
        the warm-up."""
        warm = self.cfg.warmup_s
        self.warm_end = start_at + warm
        self.res.window_start = self.warm_end
        watcher = self.loop.create_task(self._watch(stop_check))
        clock = now
        dispatch = self._dispatch
        res = self.res
        n = len(times)
        i = 0
        try:
            await sleep_until(start_at)
            self._on_start()
            while i < n and not self.stop_requested:
                woke = clock()
                rel = woke - start_at
                while i < n and times[i] <= rel:
                    tt = times[i]
                    measured = tt >= warm
                    if measured:
                        res.sent += 1
                    dispatch(start_at + tt, measured, woke)
                    i += 1
                if i < n:
                    await sleep_until(start_at + times[i])
            res.stopped_early = i < n
            if self.stop_requested and self.stopped_at is None:
                self.stopped_at = clock()
            await self._drain()
        finally:
            watcher.cancel()
            self._close_all()
        return self._finish()

    async def run_closed(self, start_at: float,
                         stop_check: StopCheck[ProgressT] | None = None) -> PartT:
        """`concurrency` clients back to back from `start_at` for the duration or count."""
        cfg = self.cfg
        self.warm_end = start_at + cfg.warmup_s
        self.res.window_start = self.warm_end
        if cfg.duration_s is not None:
            self.closed_end = start_at + cfg.duration_s
        self.closed_left = cfg.max_requests
        watcher = self.loop.create_task(self._watch(stop_check))
        try:
            await sleep_until(start_at)
            self._on_start()
            await self._clients()
            self.res.stopped_early = self.stop_requested
            await self._drain()
        finally:
            watcher.cancel()
            self._close_all()
        return self._finish()

    async def run(self, times: list[float] | None, start: Callable[[], float],
                  stop_check: StopCheck[ProgressT] | None = None) -> PartT:
        """`run_open` on `times`, or `run_closed` when the mode is closed, from `start()` (which
        may block on the other generators: nothing else runs on this loop yet)."""
        start_at = start()
        if self.cfg.mode == "open":
            assert times is not None
            return await self.run_open(times, start_at, stop_check)
        return await self.run_closed(start_at, stop_check)

    async def _watch(self, stop_check: StopCheck[ProgressT] | None) -> None:
        every = max(1, round(STOP_CHECK_S / self.tick_s))
        ticks = 0
        while True:
            await asyncio.sleep(self.tick_s)
            t = now()
            self._on_tick(t)
            ticks += 1
            if stop_check is not None and not self.stop_requested and ticks % every == 0 \
                    and stop_check(self._progress(), max(0.0, t - self.res.window_start)):
                self.stop_requested = True
                self.stopped_at = t

    def _window(self) -> tuple[float, float] | None:
        """Open loop with `window_s`: the measured window as planned, (start, end); None
        otherwise."""
        if self.cfg.mode != "open" or not self.cfg.window_s:
            return None
        t0 = self.res.window_start
        return t0, t0 + self.cfg.window_s

    def _finish(self) -> PartT:
        res = self.res
        res.errors_by_status = dict(self.status)
        res.errors_by_kind = dict(self.kinds)
        res.lag_blob = self.lag.histogram().encode()
        res.lag_late = self.lag.late
        if self.tracer is not None:
            res.traced, res.trace_ids = self.tracer.count, self.tracer.trace_ids
        return res

