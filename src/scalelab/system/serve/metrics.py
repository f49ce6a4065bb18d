"""Prometheus metrics for the server: histograms (mergeable across processes, unlike
summaries), gauges for queue depth and in-flight requests, counters for cache and responses.
All are labelled by model and version.

With several uvicorn workers each process keeps its own counters; prometheus-client's
multiprocess mode (PROMETHEUS_MULTIPROC_DIR set before start) writes them to shared files and
/metrics merges them. `scalelab serve --workers N` sets that directory up; gauges are then summed
over live processes ("livesum").
"""

from __future__ import annotations

import bisect
import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

# 0.5 ms .. 10 s: covers a tiny MLP's compute and a saturated queue's wait alike.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                   5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
MV = ("model", "version")
GC_PENDING_MAX = 10_000
"""Collections noted between flushes beyond this are not timed (a server nobody scrapes and
that serves nothing still allocates a little; the list must not grow without bound)."""


def observe_many(child: Histogram, amounts: Sequence[float]) -> None:
    """`child.observe(a)` for every a in `amounts`, writing each touched bucket and the sum
    once. Why: in multiprocess mode (replicas, the benchmark) every bucket or sum update is
    an mmap write under a lock, ~4 us here (a whole observe ~7.5 us, ~2 in one process), and
    the batcher observes two waits per job — 16 jobs a batch cost 32 observes; this costs
    one write per distinct bucket plus one. Same counts and sum as the loop (tested); falls
    back to it should prometheus-client's histogram internals (`_upper_bounds`, `_buckets`,
    `_sum`) ever change."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for a in amounts:
            child.observe(a)
        return
    if not amounts:
        return
    counts: dict[int, int] = {}
    for a in amounts:  # observe() puts a in the first bucket whose bound is >= a
        if a == a:  # a NaN is in no bucket (observe's `<=` is false for all), but in the sum
            i = bisect.bisect_left(bounds, a)
            counts[i] = counts.get(i, 0) + 1
    total.inc(sum(amounts))
    for i, n in counts.items():
        buckets[i].inc(n)


class Metrics:
    """Every metric the server exports, in a registry of its own (tests build many apps)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram(
            "scalelab_request_duration_seconds", "End-to-end inference latency in the server",
            MV, buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait_seconds = Histogram(
            "scalelab_queue_wait_seconds", "Time from enqueue until the batcher picked the job up",
            MV, buckets=LATENCY_BUCKETS, registry=r)
        self.batch_wait_seconds = Histogram(
            "scalelab_batch_formation_seconds",
            "Time from pick-up until the batch was dispatched (waiting for company)",
            MV, buckets=LATENCY_BUCKETS, registry=r)
        self.compute_seconds = Histogram(
            "scalelab_compute_seconds", "Forward pass time per batch", MV,
            buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "scalelab_batch_size", "Rows per forward pass", MV, buckets=BATCH_BUCKETS, registry=r)
        self.queue_depth = Gauge(
            "scalelab_queue_depth", "Jobs waiting (queued or being batched)", MV, registry=r,
            multiprocess_mode="livesum")
        self.inflight = Gauge(
            "scalelab_inflight_requests", "Inference requests being handled", ("model",),
            registry=r, multiprocess_mode="livesum")
        self.cache_hits = Counter("scalelab_cache_hits", "Response cache hits", MV, registry=r)
        self.cache_misses = Counter("scalelab_cache_misses", "Response cache misses", MV,
                                    registry=r)
        self.coalesced = Counter("scalelab_coalesced_requests",
                                 "Requests answered by an identical in-flight computation", MV,
                                 registry=r)
        self.responses = Counter("scalelab_responses", "Inference responses by HTTP status",
                                 ("model", "version", "status"), registry=r)
        self.shadow_compared = Counter("scalelab_shadow_compared",
                                       "Rows compared between current and shadow candidate", MV,
                                       registry=r)
        self.gc_pause_seconds = Histogram(
            "scalelab_gc_pause_seconds", "Python garbage-collector pauses of this process",
            ("generation",), buckets=LATENCY_BUCKETS, registry=r)
        self.shadow_disagreed = Counter("scalelab_shadow_disagreed",
                                        "Rows where the shadow candidate's label differed", MV,
                                        registry=r)
        self._gc_pauses: list[tuple[int, float]] = []
        self._gc_children = [self.gc_pause_seconds.labels(str(g)) for g in range(3)]
        self.flushers: list[Callable[[], None]] = [self.flush_gc]
        """Called before every exposition: parts that gather a loop turn's updates and write
        them once (serve.infer) flush here, so /metrics never misses a finished request."""

    def watch_gc(self) -> Callable[[str, dict[str, Any]], None]:
        """Time every collection into gc_pause_seconds; returns the callback (remove it from
        gc.callbacks to stop). Costs two calls per collection, which at ~50 allocations per
        request is one every ~14 requests for generation 0.

        The callback only appends to a list; `flush_gc` (run before every exposition and by
        the infer handler once a loop turn) observes them. Why: a collection can start inside
        prometheus-client's own critical section — in multiprocess mode one global,
        non-reentrant lock, held while a new label set's mmap entry is built, which allocates
        — and a callback observing there waits on a lock its own thread holds: the whole
        server stopped answering (seen in the benchmark, a fresh server's first seconds)."""
        started = [0.0]
        pauses = self._gc_pauses

        def callback(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            elif len(pauses) < GC_PENDING_MAX:
                pauses.append((min(int(info.get("generation", 2)), 2),
                               time.perf_counter() - started[0]))

        gc.callbacks.append(callback)
        return callback

    def flush_gc(self) -> None:
        """Observe the collections the gc callback noted since the last flush."""
        if not self._gc_pauses:
            return
        pending = self._gc_pauses[:]
        del self._gc_pauses[:len(pending)]  # the callback may append meanwhile: keep those
        for gen, seconds in pending:
            self._gc_children[gen].observe(seconds)

    def expose(self) -> bytes:
        """The /metrics body; merges all worker processes in multiprocess mode."""
        for flush in self.flushers:
            flush()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)
            return generate_latest(merged)
        return generate_latest(self.registry)
