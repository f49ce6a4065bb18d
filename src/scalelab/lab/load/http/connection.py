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

from scalelab.lab.load.send import body_framing


class Connection(Protocol):
    """What the engine needs of a connection: HttpConnection, or load.grpc_client's
    GrpcConnection for grpc:// targets."""

    token: Any
    closed: bool

    def send(self, request: bytes, token: Any) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


ResponseCallback = Callable[["HttpConnection", int, Any, float], None]
"""(connection, status, token, completion time) once a whole response has arrived."""
LostCallback = Callable[["HttpConnection", "BaseException | None", Any], None]
"""(connection, error or None, token of the request in flight or None) when the socket closes."""


class ProtocolError(Exception):
    """The server's bytes are not an HTTP/1.1 response we can frame."""


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection; `send` one request, get `on_response` when it is complete."""

    __slots__ = ("_buf", "_close_after", "_lost", "_need", "_on_lost", "_on_response",
                 "_status", "_time", "closed", "sent_at", "token", "transport")

    def __init__(self, on_response: ResponseCallback, on_lost: LostCallback,
                 clock: Callable[[], float]) -> None:
        self._on_response = on_response
        self._on_lost = on_lost
        self._time = clock
        self._buf = bytearray()
        self._status = 0
        self._need = -1  # body bytes still expected; -1 headers not parsed; -2 chunked; -3 to EOF
        self._close_after = False
        self._lost = False
        self.transport: asyncio.Transport | None = None
        self.token: Any = None
        self.sent_at = 0.0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have the Transport methods but do not subclass it.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes, token: Any) -> None:
        assert self.token is None and self.transport is not None
        self.token = token
        self.sent_at = self._time()
        self._need = -1
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
        buf = self._buf
        buf += data
        try:
            while self.token is not None and self._parse(buf):
                token, status = self.token, self._status
                self.token = None
                self._on_response(self, status, token, self._time())
                if self._close_after:
                    self._drop(None)
                    return
        except ProtocolError as e:
            self._drop(e)

    def _drop(self, exc: BaseException | None) -> None:
        token, self.token = self.token, None
        self._lost = True
        self.abort()
        self._on_lost(self, exc, token)

    def _parse(self, buf: bytearray) -> bool:
        """Consume one complete response from `buf`; False when more bytes are needed."""
        if self._need == -1:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    raise ProtocolError("response headers larger than 64 KiB")
                return False
            head = bytes(buf[:end]).lower()
            del buf[: end + 4]
            if not head.startswith(b"http/1."):
                raise ProtocolError(f"not an HTTP/1.x response: {head[:40]!r}")
            try:
                self._status = int(head[9:12])
            except ValueError:
                raise ProtocolError(f"bad status line: {head[:40]!r}") from None
            self._close_after = b"\r\nconnection: close" in head or head.startswith(b"http/1.0")
            need = body_framing(head)
            if need is not None:
                self._need = need
            elif self._status in (204, 304) or 100 <= self._status < 200:
                self._need = 0
            else:
                self._need = -3
        if self._need >= 0:
            if len(buf) < self._need:
                return False
            del buf[: self._need]
            return True
        if self._need == -2:
            return self._parse_chunked(buf)
        return False  # body runs to EOF: connection_lost completes it

    def _parse_chunked(self, buf: bytearray) -> bool:
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
                end = buf.find(b"\r\n\r\n", eol)
                if end < 0:
                    # no trailers: the terminating CRLF follows the size line directly
                    if len(buf) >= eol + 4 and buf[eol + 2: eol + 4] == b"\r\n":
                        end = eol
                    else:
                        return False
                del buf[: end + 4]
                return True
            nxt = eol + 2 + size + 2
            if len(buf) < nxt:
                return False
            pos = nxt

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self.closed = True
        token, self.token = self.token, None
        if token is not None and self._need == -3 and exc is None:
            # Close-delimited body: EOF is the end of the response.
            self._on_response(self, self._status, token, self._time())
            token = None
        self._on_lost(self, exc, token)
