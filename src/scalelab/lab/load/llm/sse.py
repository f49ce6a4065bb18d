"""An HTTP/1.1 keep-alive connection that reads a text/event-stream answer event by event.

Why a Protocol of our own (as `http/connection.py` for plain requests): a streaming load generator
reads tens of events per request, and parsing just the status line, the chunked framing and
the `data:` lines costs a few microseconds per read, several times less than a full client
(and aiohttp's or httpx's line iterators add an await per event). Every event is stamped with
the time its bytes arrived: one clock read per socket read, so events that arrive in one read
share a time, as they did on the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from scalelab.lab.load.llm.tokens import Event, parse_event
from scalelab.lab.load.send import (
    ProtocolError,
    body_framing,
    is_interim,
    keeps_alive,
    retry_after_s,
    status_of,
)


class StreamLost(Exception):
    """The connection closed with a request in flight; `kind` is reset or dropped."""

    def __init__(self, kind: str, detail: str, events: list[Event] | None = None,
                 retryable: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.events = events or []
        """What had streamed before the loss (to count the tokens a dropped stream wasted)."""
        self.retryable = retryable
        """A kept-alive connection closed before any byte of the answer: the server closed
        it idle as we sent; the request is sent once more on a fresh connection."""


@dataclass(slots=True)
class Answer:
    """What one streamed response delivered."""

    status: int
    events: list[Event]
    times: list[float]
    done: bool
    """`[DONE]` arrived."""
    end: float
    """When the stream ended (the `[DONE]` event, else the last byte)."""
    protocol_error: str | None
    retry_after_s: float | None = None
    """Retry-After of a refusal (non-2xx), when the server sent one."""

    def failure(self, tokens: list[int]) -> str | None:
        """Why this answer is not a success, as `StreamDriver` counts it (`tokens`: its tokens
        per event): 'status' (not 2xx), 'protocol', 'server-error' (an error event),
        'dropped' (no `[DONE]` or finish reason), 'empty' (no token); None for a success."""
        if not 200 <= self.status < 300:
            return "status"
        if self.protocol_error is not None:
            return "protocol"
        if any(e.error is not None for e in self.events):
            return "server-error"
        if not (self.done or any(e.finished for e in self.events)):
            return "dropped"
        if not any(k > 0 for k in tokens):
            return "empty"
        return None


class SseConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection reading a text/event-stream answer event by event.

    Every event is stamped with the time its bytes arrived (one clock read per socket read:
    events that arrive in one read share a time, as they did on the wire)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._time = clock
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self._fut: asyncio.Future[Answer] | None = None
        self._buf = bytearray()
        self._sse = bytearray()
        self._head = False
        self._need = 0  # content-length left; -2 chunked; -3 to EOF
        self._status = 0
        self._events: list[Event] = []
        self._times: list[float] = []
        self._done = False
        self._done_at = 0.0
        self._perr: str | None = None
        self._got = False
        self._retry_after: float | None = None
        self.served = 0
        """Answers completed on this connection."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def request(self, req: bytes) -> asyncio.Future[Answer]:
        assert self._fut is None and self.transport is not None
        self._fut = asyncio.get_running_loop().create_future()
        self._buf.clear()
        self._sse.clear()
        self._head = False
        self._events, self._times = [], []
        self._done = False
        self._perr = None
        self._got = False
        self._retry_after = None
        self.transport.write(req)
        return self._fut

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._fut is None:
            return
        t = self._time()
        self._got = True
        buf = self._buf
        buf += data
        if not self._head:
            try:
                if not self._read_head():
                    return
            except ProtocolError as e:
                self._lose("protocol", str(e))
                return
            if not 200 <= self._status < 300:
                # The body of an error is not read: the connection goes, the status is the answer.
                self.reusable = False
                self._complete(t)
                self.abort()
                return
        if self._need == -2:
            self._chunked(t)
        elif self._need == -3:
            self._feed(bytes(buf), t)
            buf.clear()
        else:
            take = min(len(buf), self._need)
            self._feed(bytes(buf[:take]), t)
            del buf[:take]
            self._need -= take
            if self._need == 0:
                self._complete(t)

    def _read_head(self) -> bool:
        """Parse the response head off the buffer (1xx interim heads skipped); False when
        more bytes are needed. ProtocolError when the answer is not HTTP/1.x."""
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) >= 9 and not buf.startswith(b"HTTP/"):
                    status_of(bytes(buf[:64]).lower())
                if len(buf) > 65536:
                    raise ProtocolError("response headers larger than 64 KiB")
                return False
            head = bytes(buf[:end]).lower()
            del buf[: end + 4]
            self._status = status_of(head)
            if not is_interim(self._status):
                break
        self._head = True
        if not keeps_alive(head):
            self.reusable = False
        if not 200 <= self._status < 300:
            self._retry_after = retry_after_s(head)
        need = body_framing(head)
        if need is not None:
            self._need = need
        else:
            self._need = -3
            self.reusable = False
        return True

    def _chunked(self, t: float) -> None:
        buf = self._buf
        while True:
            eol = buf.find(b"\r\n")
            if eol < 0:
                return
            try:
                size = int(bytes(buf[:eol]).split(b";")[0], 16)
            except ValueError:
                self._lose("protocol", "bad chunk size in chunked response")
                return
            if size == 0:
                if len(buf) < eol + 4:
                    return
                del buf[: eol + 4]
                self._complete(t)
                return
            nxt = eol + 2 + size + 2
            if len(buf) < nxt:
                return
            self._feed(bytes(buf[eol + 2: eol + 2 + size]), t)
            del buf[:nxt]

    def _feed(self, payload: bytes, t: float) -> None:
        sse = self._sse
        sse += payload
        if b"\r" in payload:
            # CRLF line ends (a CR may end one read and its LF start the next); a lone CR
            # at the end waits for what follows
            tail = sse.endswith(b"\r")
            norm = bytes(sse[:-1] if tail else sse).replace(b"\r\n", b"\n")
            sse[:] = norm + (b"\r" if tail else b"")
        while True:
            end = sse.find(b"\n\n")
            if end < 0:
                return
            block = bytes(sse[:end])
            del sse[: end + 2]
            data = b"\n".join(ln[5:].lstrip(b" ") for ln in block.split(b"\n")
                              if ln.startswith(b"data:"))
            if not data:
                continue
            try:
                ev = parse_event(data)
            except ValueError as e:
                if self._perr is None:
                    self._perr = f"event is not JSON: {e}"
                continue
            if ev is None:
                self._done = True
                self._done_at = t
            else:
                self._events.append(ev)
                self._times.append(t)

    def _complete(self, t: float) -> None:
        fut, self._fut = self._fut, None
        self.served += 1
        if fut is not None and not fut.done():
            fut.set_result(Answer(status=self._status, events=self._events, times=self._times,
                                  done=self._done, end=self._done_at if self._done else t,
                                  protocol_error=self._perr, retry_after_s=self._retry_after))

    def _lose(self, kind: str, detail: str) -> None:
        fut, self._fut = self._fut, None
        retryable = kind == "reset" and not self._got and self.served > 0
        self.abort()
        if fut is not None and not fut.done():
            fut.set_exception(StreamLost(kind, detail, self._events, retryable))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._fut is None:
            return
        if not self._head and len(self._buf) >= 9 and not self._buf.startswith(b"HTTP/"):
            try:
                status_of(bytes(self._buf[:64]).lower())
            except ProtocolError as e:
                self._lose("protocol", str(e))  # an HTTP/2 server's frames, then a reset
                return
        if self._head and self._need == -3 and exc is None:
            self._feed(bytes(self._buf), self._time())
            self._complete(self._time())
            return
        self._lose("dropped" if self._head else "reset",
                    "the server closed the connection" + (f" ({exc!r})" if exc else "")
                    + (" mid-stream" if self._head else " before answering"))
