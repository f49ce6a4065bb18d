"""A minimal HTTP/1.1 keep-alive client connection: asyncio Protocol, one request in flight.

Why not aiohttp or httpx: a load generator spends its CPU on the client, and a Protocol whose
`data_received` parses just the status line and the body framing (Content-Length or chunked) costs
a few microseconds per request, several times less than a full client, so one Python process
offers several times the load. What it costs: no redirects, no cookies, no compression, no
pipelining; the response body is framed and dropped, never decoded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, cast

from scalelab.lab.load.send import (
    ProtocolError,
    body_framing,
    is_interim,
    keeps_alive,
    retry_after_s,
    status_of,
)

__all__ = ["Connection", "HttpConnection", "ProtocolError"]


class Connection(Protocol):
    """What the engine needs of a connection: HttpConnection, or load.grpc_client's
    GrpcConnection for grpc:// targets."""

    token: Any
    closed: bool
    by_server: bool
    """The server closed it (or said it would, `Connection: close` / HTTP/1.0)."""
    request: bytes
    """The bytes of the request in flight."""

    @property
    def retryable(self) -> bool:
        """The request in flight may be sent again (see `HttpConnection.retryable`)."""
        ...

    def send(self, request: bytes, token: Any) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


ResponseCallback = Callable[["HttpConnection", int, Any, float], None]
"""(connection, status, token, completion time) once a whole response has arrived; a
connection the server keeps no longer is already `closed` then, so nothing is sent on it."""
LostCallback = Callable[["HttpConnection", "BaseException | None", Any], None]
"""(connection, error or None, token of the request in flight or None) when the socket closes
(or, after a response whose server closes the connection, right after that response)."""


def _not_http(buf: bytearray) -> ProtocolError | None:
    """The ProtocolError of bytes that are no HTTP/1.x head (an HTTP/2 server's SETTINGS
    frame, sent before it resets the connection), or None."""
    try:
        status_of(bytes(buf[:64]).lower())
    except ProtocolError as e:
        return e
    return None


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection; `send` one request, get `on_response` when it is complete.

    A response whose server will close the connection (`Connection: close`, HTTP/1.0 without
    keep-alive) closes it on our side before `on_response` runs: the driver never sends on a
    connection the server is closing, it opens a new one (one TCP connect a request against
    `python -m http.server`, as any client pays there)."""

    __slots__ = ("_buf", "_got", "_keep", "_lost", "_need", "_on_lost", "_on_response",
                 "_status", "_time", "by_server", "closed", "request", "retry_after", "sent_at",
                 "served", "token", "transport")

    def __init__(self, on_response: ResponseCallback, on_lost: LostCallback,
                 clock: Callable[[], float]) -> None:
        self._on_response = on_response
        self._on_lost = on_lost
        self._time = clock
        self._buf = bytearray()
        self._status = 0
        self._need = -1  # body bytes still expected; -1 headers not parsed; -2 chunked; -3 to EOF
        self._keep = True
        self._lost = False
        self._got = False
        self.transport: asyncio.Transport | None = None
        self.token: Any = None
        self.request = b""
        self.sent_at = 0.0
        self.served = 0
        """Responses completed on this connection."""
        self.retry_after: float | None = None
        """Retry-After (seconds) of the last non-2xx response that carried one."""
        self.closed = False
        self.by_server = False

    @property
    def retryable(self) -> bool:
        """The request in flight hit a kept-alive connection that the server closed before
        writing any byte of the response: the server closed it idle as we sent (a race every
        keep-alive client meets; uvicorn closes idle connections after 5 s), so the request was
        never served and is sent once more on a fresh connection. A fresh connection that
        dies the same way is the server's failure, not a race."""
        return not self._got and self.served > 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have the Transport methods but do not subclass it.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes, token: Any) -> None:
        assert self.token is None and self.transport is not None and not self.closed
        self.token = token
        self.request = request
        self.sent_at = self._time()
        self._need = -1
        self._got = False
        self.transport.write(request)

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._got = True
        buf = self._buf
        buf += data
        try:
            while self.token is not None and self._parse(buf):
                token, status = self.token, self._status
                self.token = None
                self.served += 1
                if not self._keep:
                    # The server closes it after this answer: closed first, so the driver's
                    # callback cannot send on it, then reported lost with nothing in flight.
                    self.by_server = True
                    self.close()
                    self._lost = True
                    self._on_response(self, status, token, self._time())
                    self._on_lost(self, None, None)
                    return
                self._on_response(self, status, token, self._time())
        except ProtocolError as e:
            self._drop(e)

    def _drop(self, exc: BaseException | None) -> None:
        token, self.token = self.token, None
        self._lost = True
        self.abort()
        self._on_lost(self, exc, token)

    def _parse(self, buf: bytearray) -> bool:
        """Consume one complete response from `buf`; False when more bytes are needed."""
        while self._need == -1:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) >= 9 and not buf.startswith(b"HTTP/"):
                    status_of(bytes(buf[:64]).lower())  # raises: HTTP/2, or not HTTP at all
                if len(buf) > 65536:
                    raise ProtocolError("response headers larger than 64 KiB")
                return False
            head = bytes(buf[:end]).lower()
            del buf[: end + 4]
            self._status = status = status_of(head)
            if is_interim(status):
                continue  # 100 Continue, 103 Early Hints: the real head follows
            self._keep = keeps_alive(head)
            if not 200 <= status < 300:
                ra = retry_after_s(head)
                if ra is not None:
                    self.retry_after = ra
            need = body_framing(head)
            if need is not None:
                self._need = need
            elif status in (204, 304) or 100 <= status < 200:
                self._need = 0
            else:
                self._need = -3
                self._keep = False
        if self._need >= 0:
            if len(buf) < self._need:
                return False
            del buf[: self._need]
            return True
        if self._need == -2:
            return self._parse_chunked(buf)
        return False  # body runs to EOF: connection_lost completes it

    def _parse_chunked(self, buf: bytearray) -> bool:
        """A whole chunked body at the front of `buf` is consumed (trailers included)."""
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return False
            try:
                size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
            except ValueError:
                raise ProtocolError("bad chunk size in chunked response") from None
            if size == 0:
                # the last chunk, then trailer lines, then an empty line
                if buf[eol + 2: eol + 4] == b"\r\n":
                    end = eol + 4
                else:
                    t = buf.find(b"\r\n\r\n", eol + 2)
                    if t < 0:
                        return False
                    end = t + 4
                del buf[:end]
                return True
            nxt = eol + 2 + size + 2
            if len(buf) < nxt:
                return False
            pos = nxt

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        self._lost = True
        if not self.closed:
            self.by_server = True
        self.closed = True
        token, self.token = self.token, None
        if token is not None and self._need == -1 and self._buf:
            exc = _not_http(self._buf) or exc  # an HTTP/2 server's frames, then a reset
        if token is not None and self._need == -3 and exc is None:
            # Close-delimited body: EOF is the end of the response.
            self.served += 1
            self._on_response(self, self._status, token, self._time())
            token = None
        self._on_lost(self, exc, token)
