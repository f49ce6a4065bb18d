"""The streaming load generator: SSE requests to an OpenAI-compatible endpoint, timed per token.

Open loop: request i is due at `start + times[i]` and its TTFT and e2e are timed from that due
time, so waiting for the server, for a connection, or for a late generator all count (no
coordinated omission: a server that stalls for 2 s shows rate × 2 s slow first tokens, not one).
Closed loop: `concurrency` clients, each sending its next request when its stream ends; TTFT is
timed from the send, so it measures service under a fixed number of streams and hides stalls.

Streams hold their connection for the whole answer (seconds), so one keep-alive connection per
stream in flight: a pool grows to `max_connections`; past it a due request waits (still timed
from its due time, and counted as generator lag). Each request is one small task (~30 µs of
overhead, nothing next to a stream of tens of events) so the logic reads top to bottom. The
schedule, window, lag, stop checks and counts are `driver.Driver`'s, shared with HTTP.

A stream that ends before `[DONE]` or a finish_reason (the server died, the proxy cut it) is an
error of kind "dropped", never a short fast answer; an event that is not JSON is "protocol";
an error object in the stream is "server-error"; a 2xx stream with no token is "empty".
"""

from __future__ import annotations

import asyncio
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.lab.load.clock import now
from scalelab.lab.load.driver import Driver
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.llm.dataset import counter
from scalelab.lab.load.llm.sse import Answer, SseConnection, StreamLost
from scalelab.lab.load.llm.token_slo import Samples
from scalelab.lab.load.llm.tokens import TokenSource, timing, tokens_per_event
from scalelab.lab.load.llm.window import ServedWindow
from scalelab.lab.load.pool import FuturePool
from scalelab.lab.load.result import Part
from scalelab.lab.load.send import SendConfig
from scalelab.lab.load.slices import slice_blobs

ERROR_KINDS = ("status", "timeout", "refused", "reset", "dropped", "protocol", "server-error",
               "empty", "tls", "other")


def _os_kind(e: OSError) -> str:
    """A TLS handshake the server refused (bad certificate, HTTP/2 only by ALPN) is "tls"."""
    import ssl

    return "tls" if isinstance(e, ssl.SSLError | ssl.CertificateError) else "other"


@dataclass(frozen=True, kw_only=True)
class ProbeAnswer:
    """One quality-probe request's answer: its text as streamed, event by event."""

    index: int
    """Which probe prompt (its position in `StreamConfig.probe_requests`)."""
    pieces: list[str]
    """The text of each event that carried any, in order."""
    tokens: list[int]
    """Tokens each of those events carried (see tokens.py for how they were known)."""
    source: TokenSource | None
    """How the tokens per event were known; None for a failed request."""
    error: str | None = None
    """The failure's kind (timeout, dropped, ...); None when the stream completed."""

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(kw_only=True)
class StreamPart(Part):
    """One process's measurements; plain values so it pickles across processes."""

    ttft_us: array[int] = field(default_factory=lambda: array("q"))
    """Per successful request, in completion order (as are the next four)."""
    e2e_us: array[int] = field(default_factory=lambda: array("q"))
    tpot_us: array[int] = field(default_factory=lambda: array("q"))
    """-1 for a one-token answer (no TPOT)."""
    output_tokens: array[int] = field(default_factory=lambda: array("q"))
    prompt_tokens: array[int] = field(default_factory=lambda: array("q"))
    """-1 when the server did not report usage."""
    itl_blob: str = ""
    """HdrHistogram of every inter-token gap (µs)."""
    itl_slices: list[str] = field(default_factory=list)
    """The gaps in `load.slices.SLICES` consecutive slices (histogram blobs)."""
    token_sources: dict[str, int] = field(default_factory=dict)
    """How tokens per chunk were known, by request."""
    failed_output_tokens: int = 0
    """Tokens streamed by requests that then failed (dropped mid-way)."""
    max_in_flight: int = 0
    probe: list[ProbeAnswer] = field(default_factory=list)
    """The quality probe's answers, in completion order."""
    tokens_in_window: int | None = None
    """Output tokens those successes (the warm-up's included) delivered inside the window."""
    window_span_s: float | None = None
    """The window those count over: its planned length, or up to an early stop."""


@dataclass(kw_only=True)
class StreamConfig(SendConfig):
    """How one process drives streaming load: `SendConfig`'s settings, where one stream holds
    its connection for the whole answer (so `max_connections` caps streams at once) and a
    stream not finished `timeout_s` after its due time fails with kind "timeout"."""

    timeout_s: float = 60.0
    """Streams last seconds: a longer default than a plain request's."""
    tokenizer: str | None = None
    """The model's tokenizer (`dataset.token_counter`'s spec): counts the tokens of a stream
    that reports no usage (None: one token per chunk, an estimate; see tokens.py)."""
    probe_requests: list[bytes] = field(default_factory=list)
    """The greedy-agreement probe: sent as the first measured requests, in this order, so
    every level answers the same prompts under its own load; their texts are kept
    (`StreamPart.probe`). Measured like any other request."""


def _copy(values: array[int]) -> np.ndarray:
    # A copy, not a view: a live view would stop the array growing (BufferError).
    return np.array(values, dtype=np.int64)


class StreamDriver(Driver[StreamPart, Samples]):
    """One asyncio loop's worth of streaming load: `Driver`'s schedule, one small task per
    request that holds a pooled connection for its whole stream."""

    def __init__(self, cfg: StreamConfig) -> None:
        super().__init__(cfg, StreamPart())
        self.cfg: StreamConfig = cfg
        self._gaps_us = array("q")
        self._sources: defaultdict[str, int] = defaultdict(int)
        # Built once per process (a tokenizer loads in ~0.1 s); counting runs only for streams
        # that report no usage, once per answer, off the send path.
        self._count = counter(cfg.tokenizer) if cfg.tokenizer else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool = FuturePool(cfg.max_connections, connect=self._open, spawn=self._spawn)
        self._in_flight = 0
        self._next_probe = 0
        # Closed loop: warm-up streams still running, and the event set when the last ends.
        self._warm_flight = 0
        self._warm_done: asyncio.Event | None = None
        # Open loop with a window: what the server finished inside it, warm-up included.
        self._served = ServedWindow() if cfg.window_s is not None and cfg.mode == "open" \
            else None

    # ---- the connection pool ----

    async def _open(self) -> SseConnection:
        t = self.cfg.target
        _, conn = await self.loop.create_connection(lambda: SseConnection(now),
                                                    t.host, t.port, ssl=t.ssl_context())
        self.res.connections_opened += 1
        return conn

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- one request ----

    def _request_bytes(self, measured: bool) -> tuple[bytes, int | None]:
        """The next request, and its probe index when it is one of the probe's prompts."""
        probe = self.cfg.probe_requests
        if measured and self._next_probe < len(probe):
            self._next_probe += 1
            return self._traced(probe[self._next_probe - 1], measured), self._next_probe - 1
        return self._next_request(measured), None

    async def _one(self, start: float, measured: bool, dispatched: float | None) -> None:
        res = self.res
        req, probe = self._request_bytes(measured)
        self._in_flight += 1
        if self._in_flight > res.max_in_flight:
            res.max_in_flight = self._in_flight
        conn: SseConnection | None = None
        try:
            async with asyncio.timeout_at(start + self.cfg.timeout_s):
                conn, waited = await self._pool.acquire()
                if dispatched is not None and measured:
                    # Lag is judged at dispatch, or when a connection freed up at the cap; the
                    # connect itself is the network's time and shows in TTFT, not in the lag.
                    self.lag.add((now() if waited else dispatched) - start)
                    res.last_send = max(res.last_send, now())
                try:
                    ans = await conn.request(req)
                except StreamLost as e:
                    if not e.retryable:
                        raise
                    # The server closed the kept-alive connection idle as we sent: once more.
                    res.retries += 1
                    self._lost(conn)
                    conn = None
                    conn, _ = await self._pool.acquire(fresh=True)
                    ans = await conn.request(req)
            self._release(conn)
            conn = None
            kind = self._record(start, ans, measured)
            if probe is not None:
                self._keep_probe(probe, ans, kind)
        except TimeoutError as e:
            self._fail("timeout", measured, probe, e)
        except StreamLost as e:
            self._fail(e.kind, measured, probe, e)
            if measured and e.events:
                res.failed_output_tokens += sum(tokens_per_event(e.events)[0])
        except ConnectionRefusedError as e:
            self._fail("refused", measured, probe, e)
        except (ConnectionResetError, BrokenPipeError) as e:
            self._fail("reset", measured, probe, e)
        except OSError as e:
            self._fail(_os_kind(e), measured, probe, e)
        finally:
            self._in_flight -= 1
            if conn is not None:
                # Timed out (or failed) with the stream open: the connection is unusable.
                conn.abort()
                self._pool.release(conn)

    def _release(self, conn: SseConnection) -> None:
        if not conn.reusable and not conn.closed:
            self.res.server_closes += 1  # it said Connection: close (or spoke HTTP/1.0)
        self._pool.release(conn, reusable=conn.reusable)

    def _lost(self, conn: SseConnection) -> None:
        self.res.server_closes += 1
        conn.abort()
        self._pool.release(conn, reusable=False)

    def _fail(self, kind: str, measured: bool, probe: int | None = None,  # type: ignore[override]
              detail: BaseException | None = None) -> None:
        super()._fail(kind, measured, detail)
        if probe is not None:
            self.res.probe.append(ProbeAnswer(index=probe, pieces=[], tokens=[], source=None,
                                              error=kind))

    def _keep_probe(self, index: int, ans: Answer, kind: str | None) -> None:
        # A second pass over the probe's few events (tokens_per_event is cheap next to a
        # stream) keeps the hot path of every other request unchanged.
        if kind is not None:
            self.res.probe.append(ProbeAnswer(index=index, pieces=[], tokens=[], source=None,
                                              error=kind))
            return
        tokens, source, _ = tokens_per_event(ans.events)
        kept = [(e.text, k) for e, k in zip(ans.events, tokens, strict=True) if e.text]
        self.res.probe.append(ProbeAnswer(index=index, pieces=[t for t, _ in kept],
                                          tokens=[k for _, k in kept], source=source))

    def _record(self, start: float, ans: Answer, measured: bool) -> str | None:
        """Record a measured answer; returns its failure kind (None: a success)."""
        if not measured:
            self.res.warmup_requests += 1
            self._note_served(ans)
            return None
        res = self.res
        res.last_done = now()
        if not 200 <= ans.status < 300:
            self.status[str(ans.status)] += 1
            self.kinds["status"] += 1
            if ans.retry_after_s is not None:
                res.retry_after_count += 1
                res.retry_after_max_s = max(res.retry_after_max_s or 0.0, ans.retry_after_s)
            return "status"
        tokens, source, prompt = tokens_per_event(ans.events, self._count)
        kind = ans.failure(tokens)
        # timing is None only without a token, which `failure` already calls 'empty'
        tm = timing(start, ans.times, tokens, ans.end) if kind is None else None
        if kind is not None or tm is None:
            kind = kind or "empty"
            self.kinds[kind] += 1
            if kind not in res.error_examples:
                err = next((e.error for e in ans.events if e.error), None)
                res.error_examples[kind] = err or ans.protocol_error or {
                    "dropped": "the stream ended without [DONE] or a finish_reason",
                    "empty": "a 2xx stream that carried no token"}.get(kind, kind)
            res.failed_output_tokens += sum(tokens)
            return kind
        res.ok += 1
        self._note_served(ans, tokens)
        self._sources[source] += 1
        res.ttft_us.append(int(tm.ttft_s * 1e6))
        res.e2e_us.append(int(tm.e2e_s * 1e6))
        res.tpot_us.append(-1 if tm.tpot_s is None else int(tm.tpot_s * 1e6))
        res.output_tokens.append(tm.output_tokens)
        res.prompt_tokens.append(-1 if prompt is None else prompt)
        self._gaps_us.extend(int(g * 1e6) for g in tm.gaps_s)
        return None

    def _note_served(self, ans: Answer, tokens: list[int] | None = None) -> None:
        if self._served is not None:
            self._served.add(ans, tokens)

    def _window_counts(self) -> None:
        """Successes completed and tokens delivered inside the window, over its span."""
        window = self._window()
        if self._served is None or window is None:
            return
        t0, t1 = window
        if self.stopped_at is not None:
            # The rates divide by this span (`window_span_s`), so it ends at an early stop.
            t1 = min(t1, self.stopped_at)
        self.res.served_in_window, self.res.tokens_in_window = self._served.count(t0, t1)
        self.res.window_span_s = max(0.0, t1 - t0)

    # ---- open loop ----

    def _dispatch(self, due: float, measured: bool, woke: float) -> None:
        self._spawn(self._one(due, measured, woke))

    # ---- closed loop ----

    async def _client(self) -> None:
        while self.can_send():
            t = now()
            measured = t >= self.warm_end
            if measured and self._warm_flight:
                # The window opens once the warm-up's streams have ended: measured ones
                # started beside them would share the engine with unmeasured work, and the
                # window would count the warm-up's tail as time without tokens (186.6 output
                # tokens/s at 10 streams against 228.0 without a warm-up).
                await self._warm_drained()
                continue
            if measured:
                self._count_closed_send(measured)
                self.res.last_send = t
            else:
                self._warm_flight += 1
            before = sum(self.kinds.values())
            try:
                await self._one(t, measured, None)
            finally:
                if not measured:
                    self._warm_flight -= 1
                    if not self._warm_flight and now() >= self.warm_end:
                        self._open_window()
            if self.kinds.get("refused", 0) and sum(self.kinds.values()) > before:
                await asyncio.sleep(0.01)  # a refused client retries shortly, not in a spin

    async def _warm_drained(self) -> None:
        """Wait for the warm-up's streams to end (each ends by its own timeout at the latest)."""
        if self._warm_done is None:
            self._warm_done = asyncio.Event()
        await self._warm_done.wait()

    def _open_window(self) -> None:
        """The last warm-up stream ended after the warm-up: the measured window starts now,
        and a window of fixed duration keeps its length."""
        if self._warm_done is None:
            self._warm_done = asyncio.Event()
        if self._warm_done.is_set():
            return
        t = now()
        if t > self.warm_end:
            self.closed_end += t - self.warm_end
            self.res.window_start = t
        self._warm_done.set()

    async def _clients(self) -> None:
        for _ in range(self.cfg.concurrency):
            self._spawn(self._client())
        # The stopping rule may end the clients; `stopped_early` is read after they have.
        await self._drain()

    # ---- the end ----

    def _progress(self) -> Samples:
        """The measurements so far as `Samples` (ITL left out: the stopping rule's ITL
        objectives are judged at the end of the step)."""
        r = self.res
        return Samples(ttft_us=_copy(r.ttft_us), tpot_us=_copy(r.tpot_us),
                       e2e_us=_copy(r.e2e_us), output_tokens=_copy(r.output_tokens),
                       requests=r.ok + sum(self.kinds.values()), itl_within={})

    async def _drain(self) -> None:
        # Each request ends by its own timeout, so this ends within timeout + a little.
        while self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.cfg.timeout_s + 5.0)

    def _close_all(self) -> None:
        for conn in self._pool.idle:
            conn.abort()
        self._pool.idle.clear()
        for t in list(self._tasks):
            t.cancel()

    def _finish(self) -> StreamPart:
        res = super()._finish()
        self._window_counts()
        res.token_sources = dict(self._sources)
        h = LatencyHistogram()
        gaps = np.frombuffer(self._gaps_us, dtype=np.int64)
        h.record_us(gaps)
        res.itl_blob = h.encode()
        res.itl_slices = slice_blobs(gaps)
        return res
