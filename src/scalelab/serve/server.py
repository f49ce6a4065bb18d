"""Run the app under uvicorn: one process, or N workers sharing the port.

Graceful shutdown (SIGINT/SIGTERM): uvicorn stops accepting connections and waits up to
`graceful_s` for in-flight requests; then the app's lifespan drains every version's queue and
stops the inference threads. Workers rebuild the app from settings passed as JSON in the
environment (uvicorn needs an import string to start several processes).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import tempfile

import h11
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from scalelab.core.errors import BadUsageError
from scalelab.serve import logs
from scalelab.serve.app import create_app
from scalelab.serve.config import ServerSettings

SETTINGS_ENV = "SCALELAB_SERVE_SETTINGS"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def app_from_env() -> FastAPI:
    """uvicorn factory: the app for the settings in $SCALELAB_SERVE_SETTINGS."""
    raw = os.environ.get(SETTINGS_ENV)
    if raw is None:
        raise BadUsageError(f"{SETTINGS_ENV} is not set; start the server with `scalelab serve`")
    settings = ServerSettings.from_json(raw)
    logs.configure(settings.log_level)
    return create_app(settings)


@functools.cache
def _read_timeout_s() -> float:
    raw = os.environ.get(SETTINGS_ENV)
    return ServerSettings.from_json(raw).read_timeout_s if raw else 10.0


class ReadTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol plus a deadline on reading each request (head and body).

    Stock uvicorn arms its keep-alive timer only after a response and cancels it on any byte,
    so a client that trickles a request a byte at a time keeps its connection (and a file
    descriptor) forever. Here a timer starts when the connection opens or a new request's
    first byte arrives and is cancelled once h11 has the whole request; if it fires first the
    connection is closed. Workers read the limit from the settings in the environment.
    """

    _read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read_timer()

    def _arm_read_timer(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(_read_timeout_s(), self._read_expired)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._arm_read_timer()  # no-op while armed; SEND_BODY covers a pipelined request
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._cancel_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        super().connection_lost(exc)

    def _read_expired(self) -> None:
        self._read_timer = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and \
                not self.transport.is_closing():
            self.transport.close()


def _multiproc_dir() -> None:
    """Several workers: give prometheus-client a fresh shared directory unless one is set.
    It must exist before the workers import prometheus_client (they inherit the env)."""
    if os.environ.get(MULTIPROC_ENV):
        return
    d = tempfile.mkdtemp(prefix="scalelab-prom-")
    os.environ[MULTIPROC_ENV] = d
    atexit.register(shutil.rmtree, d, True)


def serve(settings: ServerSettings) -> None:
    """Serve until interrupted (blocks)."""
    import uvicorn

    if not settings.model_repo.is_dir():
        raise BadUsageError(f"--model-repo {settings.model_repo} is not a directory")
    if settings.workers > 1:
        _multiproc_dir()
    os.environ[SETTINGS_ENV] = settings.to_json()
    logs.configure(settings.log_level)
    uvicorn.run("scalelab.serve.server:app_from_env", factory=True, host=settings.host,
                port=settings.port, workers=settings.workers, log_config=None,
                access_log=False, log_level=settings.log_level, http=ReadTimeoutH11,
                timeout_graceful_shutdown=int(settings.graceful_s) or None)
