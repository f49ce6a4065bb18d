"""The prediction cache (`web.ttl_cache.TtlLru`, the server's own) measured under a realistic
repeat rate: request keys drawn Zipf-distributed from the test rows, arriving as a Poisson
stream that drives the cache's injected clock, so expiry is simulated without sleeping.

A cached prediction is stale once the model or the world behind the features changes; the TTL
bounds that staleness, and the LRU bound caps the memory. Both cost hits: the measurement shows
how many, at the configured rate and TTL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.ttl_cache import TtlLru


def zipf_requests(n_keys: int, n_requests: int, *, s: float = 1.1, seed: int = 0) -> np.ndarray:
    """Request keys in [0, n_keys): key rank r drawn with probability ~ 1 / r^s (a few popular
    flights asked about often, a long tail asked about once)."""
    if n_keys < 1 or n_requests < 0 or not s > 0:
        raise BadUsageError("zipf: n_keys >= 1, n_requests >= 0 and s > 0 required")
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n_keys + 1, dtype=np.float64) ** s
    perm = rng.permutation(n_keys)  # which rows are popular is random, not the first ones
    return perm[rng.choice(n_keys, size=n_requests, p=w / w.sum())]


@dataclass(frozen=True, kw_only=True)
class CacheRun:
    """The cache measured on one request stream."""

    requests: int
    hit_rate: float
    expired: int
    evicted: int
    p50_ms_cached: float
    p95_ms_cached: float
    p50_ms_uncached: float
    p95_ms_uncached: float
    mean_ms_cached: float
    mean_ms_uncached: float
    zipf_s: float
    rate_per_s: float
    ttl_s: float
    capacity: int

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


class _SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@torch.inference_mode()
def measure_cache(model: Any, categorical: torch.Tensor, numeric: torch.Tensor, *,
                  n_requests: int = 2000, zipf_s: float = 1.1, rate_per_s: float = 200.0,
                  ttl_s: float = 5.0, capacity: int = 1024, seed: int = 0) -> CacheRun:
    """Serve a Zipf request stream at batch 1 with and without the cache; time each request.

    Arrival times (Poisson at `rate_per_s`) drive the simulated clock that the TTL reads, so
    expiry behaves as at that rate without waiting for it. The key is the row's input bytes,
    as a server would key it (not the row number).
    """
    n = int(categorical.shape[0])
    keys = zipf_requests(n, n_requests, s=zipf_s, seed=seed)
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate_per_s, size=n_requests)
    clock = _SimClock()
    cache: TtlLru[int] = TtlLru(max_entries=capacity, ttl_s=ttl_s, clock=clock)
    cached_ms, uncached_ms = [], []
    for i, row in enumerate(keys.tolist()):
        clock.now += float(gaps[i])
        c, x = categorical[row:row + 1], numeric[row:row + 1]
        t0 = time.perf_counter()
        model(c, x).argmax(dim=1).cpu()
        uncached_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        key = c.cpu().numpy().tobytes() + x.cpu().numpy().tobytes()
        hit = cache.get(key)
        if hit is None:
            cache.put(key, int(model(c, x).argmax(dim=1).cpu()))
        cached_ms.append((time.perf_counter() - t0) * 1e3)
    cm, um = np.asarray(cached_ms), np.asarray(uncached_ms)
    return CacheRun(requests=n_requests, hit_rate=cache.stats.hit_rate,
                    expired=cache.stats.expired, evicted=cache.stats.evicted,
                    p50_ms_cached=float(np.percentile(cm, 50)) if cm.size else 0.0,
                    p95_ms_cached=float(np.percentile(cm, 95)) if cm.size else 0.0,
                    p50_ms_uncached=float(np.percentile(um, 50)) if um.size else 0.0,
                    p95_ms_uncached=float(np.percentile(um, 95)) if um.size else 0.0,
                    mean_ms_cached=float(cm.mean()) if cm.size else 0.0,
                    mean_ms_uncached=float(um.mean()) if um.size else 0.0,
                    zipf_s=zipf_s, rate_per_s=rate_per_s, ttl_s=ttl_s, capacity=capacity)
