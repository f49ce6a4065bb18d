"""Client-side helpers for the end-to-end tests: concurrent requests and metric reading."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


def fire(url: str, n: int, body: Callable[[int], dict[str, Any]],
         headers: Callable[[int], dict[str, str]] = lambda i: {}) -> list[httpx.Response]:
    """Send n POSTs at once and return every response (raises if any got no answer)."""

    async def go() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n + 5, max_keepalive_connections=n + 5)
        async with httpx.AsyncClient(timeout=60, limits=limits) as c:
            return list(await asyncio.gather(
                *(c.post(url, json=body(i), headers=headers(i)) for i in range(n))))

    return asyncio.run(go())


def samples(base: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def wait_for(cond: Callable[[], bool], what: str, deadline_s: float = 15.0) -> None:
    """Poll `cond` until true; fail naming `what` after the deadline."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
