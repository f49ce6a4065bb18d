"""A deadline on reading each request, for uvicorn's h11 and httptools protocols.

Stock uvicorn arms its keep-alive timer only after a response and cancels it on any byte, so a
client that trickles a request a byte at a time (slowloris) keeps its connection, and a file
descriptor, forever. These protocols start a timer when the connection opens or a new request's
first byte arrives, cancel it once the whole request (head and body) is in, and close the
connection if it fires first.

uvicorn builds one protocol object per connection from a class named by an import string (so
worker processes can import it), which leaves no place to pass the limit: it is read from
$SCALELAB_READ_TIMEOUT_S (seconds; `web.runner.run` sets it). Costs: a legitimate client on a
link slower than body size / timeout is cut off.
"""

from __future__ import annotations

import asyncio
import os

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_TIMEOUT_ENV = "SCALELAB_READ_TIMEOUT_S"
DEFAULT_READ_TIMEOUT_S = 10.0

H11_PATH = "scalelab.layers.web.timeouts:ReadTimeoutH11"
HTTPTOOLS_PATH = "scalelab.layers.web.timeouts:ReadTimeoutHttpTools"


def read_timeout_s() -> float:
    """The per-request read limit for this process (env, else 10 s)."""
    raw = os.environ.get(READ_TIMEOUT_ENV)
    try:
        value = float(raw) if raw else DEFAULT_READ_TIMEOUT_S
    except ValueError:
        return DEFAULT_READ_TIMEOUT_S
    return value if value > 0 else DEFAULT_READ_TIMEOUT_S


class _ReadTimer:
    """The timer both protocols share; `transport` and `loop` come from the uvicorn class."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _read_timer: asyncio.TimerHandle | None = None
    _timeout_s: float = DEFAULT_READ_TIMEOUT_S
    _reading = True
    """True from a request's first byte (or the connection's start) until its last."""

    def _arm_read_timer(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self._timeout_s, self._read_expired)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_expired(self) -> None:
        self._read_timer = None
        if self._reading and not self.transport.is_closing():
            self.transport.close()


class ReadTimeoutH11(_ReadTimer, H11Protocol):
    """uvicorn's pure-Python h11 protocol plus the read deadline."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._timeout_s = read_timeout_s()
        super().connection_made(transport)
        self._arm_read_timer()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._arm_read_timer()  # no-op while armed; SEND_BODY covers a pipelined request
        super().data_received(data)
        self._reading = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        if not self._reading:
            self._cancel_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        super().connection_lost(exc)


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: only the h11 protocol exists
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

if HttpToolsProtocol is not None:

    class ReadTimeoutHttpTools(_ReadTimer, HttpToolsProtocol):
        """uvicorn's httptools (C, llhttp) protocol plus the read deadline: the parser calls
        on_message_begin at a request's first byte and on_message_complete after its body."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._timeout_s = read_timeout_s()
            super().connection_made(transport)
            self._arm_read_timer()

        def on_message_begin(self) -> None:
            self._reading = True
            self._arm_read_timer()
            super().on_message_begin()

        def on_message_complete(self) -> None:
            self._reading = False
            self._cancel_read_timer()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_read_timer()
            super().connection_lost(exc)
