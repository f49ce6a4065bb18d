"""A map bounded in size (LRU) whose entries expire `ttl_s` after they were stored: the server's
response cache and the model bench's simulation of it are this one structure.

The clock is injected, so expiry is tested and simulated without sleeping. The counters cost a
few integer additions per lookup; they are what the bench reports and what a server may export.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from scalelab.lab.core.errors import BadUsageError

V = TypeVar("V")


@dataclass(kw_only=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    expired: int = 0
    """Lookups that found an entry past its TTL (counted as misses too)."""
    evicted: int = 0
    """Entries dropped to respect the size bound."""

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


class TtlLru(Generic[V]):
    """key -> value, each entry valid for `ttl_s` after it was stored, at most `max_entries`."""

    def __init__(self, *, max_entries: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or not ttl_s > 0:
            raise BadUsageError(f"cache: max_entries >= 1 and ttl > 0 required, got "
                                f"{max_entries} and {ttl_s}")
        self.max_entries = max_entries
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self.stats = CacheStats()
        self._items: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> V | None:
        entry = self._items.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        expires_at, value = entry
        if self._clock() >= expires_at:
            del self._items[key]
            self.stats.expired += 1
            self.stats.misses += 1
            return None
        self._items.move_to_end(key)
        self.stats.hits += 1
        return value

    def put(self, key: Hashable, value: V) -> None:
        self._items[key] = (self._clock() + self.ttl_s, value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)
            self.stats.evicted += 1
