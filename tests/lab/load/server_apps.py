"""Small user endpoints with a known limit, served by uvicorn on 127.0.0.1 (a server nobody here
wrote), for the server-side signals tests:

    python server_apps.py cpu --work-ms 8     one core of CPU work per request on the event loop's
                                              one thread; /metrics from prometheus_client (its
                                              default process collector: process_cpu_seconds_total,
                                              process_resident_memory_bytes)
    python server_apps.py admit --rate 30     admits 30 requests/s (a token bucket, burst 1);
                                              above it answers 503 at once; accepted ones take
                                              2 ms; no /metrics

Prints "PORT <n>" once it listens, then serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

Scope = dict[str, Any]


async def _send(send: Any, status: int, body: bytes, ctype: bytes = b"text/plain") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def cpu_app(work_s: float) -> Any:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics":
            await _send(send, 200, generate_latest(), CONTENT_TYPE_LATEST.encode())
            return
        t0 = time.thread_time()
        while time.thread_time() - t0 < work_s:  # CPU work on the loop's thread: no await
            pass
        await _send(send, 200, b"ok\n")
    return app


def admit_app(rate: float) -> Any:
    state = {"tokens": 1.0, "t": time.monotonic()}

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics":
            await _send(send, 404, b"no metrics\n")
            return
        now = time.monotonic()
        state["tokens"] = min(1.0, state["tokens"] + (now - state["t"]) * rate)
        state["t"] = now
        if state["tokens"] < 1.0:
            await _send(send, 503, b"over the admission limit\n")
            return
        state["tokens"] -= 1.0
        await asyncio.sleep(0.002)
        await _send(send, 200, b"ok\n")
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["cpu", "admit"])
    p.add_argument("--work-ms", type=float, default=8.0)
    p.add_argument("--rate", type=float, default=30.0)
    a = p.parse_args()
    app = cpu_app(a.work_ms / 1000) if a.kind == "cpu" else admit_app(a.rate)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections made before uvicorn's loop starts wait in the backlog
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           lifespan="off"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
