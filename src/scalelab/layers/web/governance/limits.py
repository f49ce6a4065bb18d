"""The governance policies as pure functions: token buckets, budget windows, CPU apportioning.

Nothing here reads a clock or keeps state: the caller passes `now` and gets the new state back,
so every decision is tested with exact numbers (`tests/layers/web/test_limits.py`). The middleware
that applies them is `web.governance.middleware`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from datetime import UTC, datetime
from typing import Literal, TypeVar

Unit = Literal["requests", "tokens", "core_seconds"]
UNITS: tuple[str, ...] = ("requests", "tokens", "core_seconds")
Period = Literal["minute", "hour", "day"]
PERIOD_S: dict[str, int] = {"minute": 60, "hour": 3600, "day": 86400}
"""Fixed windows aligned to UTC: the Unix epoch is UTC midnight, so floor(t / 86400) * 86400
is the start of the UTC day (leap seconds do not exist in Unix time)."""

Bucket = tuple[float, float]
"""A token bucket's state: (tokens left, when they were counted)."""

K = TypeVar("K", bound=Hashable)


def full_bucket(burst: float, now: float) -> Bucket:
    """A bucket that starts full: a new client may send its whole burst at once."""
    return (float(burst), now)


def take(state: Bucket, now: float, rate: float, burst: float) -> tuple[Bucket, float]:
    """Spend one token: (new state, 0.0) when there was one, else (new state, seconds until
    one will be). Tokens refill at `rate` a second up to `burst`; a clock that steps back
    refills nothing (monotonic clocks do not, but a test's may)."""
    tokens, at = state
    if now > at:  # comparisons, not min()/max(): this runs once per request (~3x cheaper)
        tokens += (now - at) * rate
        if tokens > burst:
            tokens = burst
    if tokens >= 1.0:
        return (tokens - 1.0, now), 0.0
    return (tokens, now), (1.0 - tokens) / rate


def retry_after(wait_s: float) -> int:
    """The Retry-After header's whole seconds for a wait: rounded up, at least 1 (a client told
    0 retries at once and is refused again)."""
    return max(1, math.ceil(wait_s - 1e-9))


def window_start(now_epoch: float, period: str) -> float:
    """Start (Unix seconds) of the fixed UTC window of `period` that holds `now_epoch`."""
    p = PERIOD_S[period]
    return math.floor(now_epoch / p) * p


def window_end(now_epoch: float, period: str) -> float:
    """When the window holding `now_epoch` resets."""
    return window_start(now_epoch, period) + PERIOD_S[period]


def exhausted(used: float, limit: float, unit: str) -> bool:
    """Whether one more request would pass the budget. A request's cost in requests is known
    before it runs (1), so the budget admits exactly `limit` of them; its tokens and CPU are
    known only after, so those budgets admit until the burn reaches the limit (the last
    admitted request may pass it by its own cost)."""
    if unit == "requests":
        return used + 1 > limit
    return used >= limit


def apportion(cpu_s: float, counts: Mapping[K, int]) -> dict[K, float]:
    """Share `cpu_s` core-seconds among the keys in proportion to their finished requests.
    The process's CPU over a tick is measured once (one process_time() a tick, not one a
    request); each request that finished in the tick is charged an equal share. Costs: a
    client whose requests are heavier than the others' is undercharged, and CPU spent between
    requests (the event loop idling, the metrics scrape) is charged to the requests around it."""
    total = sum(counts.values())
    if total <= 0 or cpu_s <= 0:
        return {k: 0.0 for k in counts}
    return {k: cpu_s * n / total for k, n in counts.items()}


def utc_iso(epoch: float) -> str:
    """`2026-12-02T00:00:00Z` for a Unix time (what a refusal says about the reset)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def amount(x: float, unit: str) -> str:
    """A budget quantity as people read it: `1,000,000 requests`, `2.5 core-seconds`."""
    name = "core-seconds" if unit == "core_seconds" else unit
    if float(x).is_integer():
        return f"{int(x):,} {name}"
    return f"{x:,.3g} {name}"
