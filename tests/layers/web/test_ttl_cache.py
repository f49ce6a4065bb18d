"""The TTL LRU (the server's response cache, the model bench's simulated one), with a
hand-driven clock."""

from __future__ import annotations

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.ttl_cache import TtlLru


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_entries_expire_after_ttl() -> None:
    clock = Clock()
    c: TtlLru[int] = TtlLru(max_entries=10, ttl_s=5.0, clock=clock)
    c.put("k", 1)
    clock.t += 4.999
    assert c.get("k") == 1
    clock.t += 0.001  # exactly ttl after the put: expired
    assert c.get("k") is None
    assert (c.stats.hits, c.stats.misses, c.stats.expired) == (1, 1, 1)
    assert len(c) == 0
    c.put("k", 2)  # a fresh put restarts the lifetime
    clock.t += 3
    assert c.get("k") == 2


def test_lru_bound_evicts_least_recently_used() -> None:
    c: TtlLru[int] = TtlLru(max_entries=2, ttl_s=60, clock=Clock())
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3
    assert c.stats.evicted == 1
    assert c.stats.hit_rate == pytest.approx(3 / 4)


def test_bad_cache_settings() -> None:
    with pytest.raises(BadUsageError):
        TtlLru(max_entries=0, ttl_s=1)
    with pytest.raises(BadUsageError):
        TtlLru(max_entries=1, ttl_s=0)


def test_lru_evicts_least_recent_and_expires() -> None:
    now = [0.0]
    c: TtlLru[str] = TtlLru(max_entries=2, ttl_s=10, clock=lambda: now[0])
    c.put(("m", 1, "a"), "A")
    c.put(("m", 1, "b"), "B")
    assert c.get(("m", 1, "a")) == "A"  # a is now most recent
    c.put(("m", 1, "c"), "C")
    assert c.get(("m", 1, "b")) is None and len(c) == 2
    now[0] = 10.0
    assert c.get(("m", 1, "a")) is None and c.get(("m", 1, "c")) is None
