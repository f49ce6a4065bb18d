"""A real uvicorn server on 127.0.0.1 in a thread of the test process: no interpreter start or
torch import per server (seconds on a busy 2-core machine), and the app object stays in reach
(its tracer can be flushed instead of waiting out the exporter's interval)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(app: ASGIApp, *, timeout_s: float = 60.0) -> Iterator[str]:
    """Run `app` (lifespan included) until the block ends; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           access_log=False, lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    t0 = time.monotonic()
    while not server.started:
        if not t.is_alive() or time.monotonic() - t0 > timeout_s:
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(timeout=timeout_s)
