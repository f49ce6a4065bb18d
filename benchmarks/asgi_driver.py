"""Drive an ASGI app in-process, one request after another, for the overhead benchmarks.

bench_observe (tracing) and bench_governance (the limiter) measure what a layer adds to a
request of the tabular server; both call the app directly, without a socket, so the layer's
cost is not lost in the HTTP stack's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
INFER = "/v2/models/flights/infer"


def infer_scope(headers: list[tuple[bytes, bytes]], path: str = INFER) -> dict[str, Any]:
    """An HTTP POST scope to `path` as uvicorn would build it."""
    return {"type": "http", "method": "POST", "path": path, "headers": headers,
            "query_string": b"", "state": {}, "http_version": "1.1", "scheme": "http",
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "root_path": "",
            "raw_path": path.encode(), "asgi": {"version": "3.0"}}


async def timed_requests(app: App, headers: list[tuple[bytes, bytes]], body: bytes, n: int,
                         flush: Callable[[], None] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this whole process) per request, n requests one after
    another. The CPU figure counts every thread of the process (inference, a span exporter)
    and is far less disturbed than wall time by other work on a shared machine: waiting for a
    core shows in wall time, not in CPU time. `flush` (e.g. a span exporter's) runs inside the
    timed window, so what a series defers is charged to it, not to the next series' round."""
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            status.append(msg["status"])

    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        await app(infer_scope(headers), receive, send)
    if flush is not None:
        flush()
    dt, dc = (time.perf_counter() - t0) / n, (time.process_time() - c0) / n
    bad = [s for s in status if s != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} requests failed (status {bad[0]})")
    return dt, dc


def rotated(names: list[str], r: int) -> list[str]:
    """The series in round r, starting with series r mod n: neither the first of a round (run
    right after the others' garbage and cache traffic) nor the last (a machine getting busier
    through a round) is always the same series."""
    k = r % len(names)
    return names[k:] + names[:k]


async def start_lifespan(app: App) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]:
    """Run the app's lifespan startup; (its task, its inbox) for `stop_lifespan`."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"},
                                    "state": {}}, inbox.get, outbox.put))
    msg = await outbox.get()
    if msg["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"server did not start: {msg}")
    return task, inbox


async def stop_lifespan(running: list[tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]]
                        ) -> None:
    """Shut down every app `start_lifespan` started."""
    for task, inbox in running:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 30)
