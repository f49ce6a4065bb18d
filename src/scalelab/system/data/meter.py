"""Stage metering: rows in/out, wall time and peak memory of each pipeline stage.

Peak memory is the resident set size (RSS) of this process *plus its child processes*
(LocalCluster workers are children), sampled by a background thread every `interval_s`
(default 20 ms) with psutil; a stage's peak is the largest sample taken while it ran (at least
one sample at its start and end). Sampling can miss a spike shorter than the interval; ru_maxrss
cannot be reset per stage and ignores children that are still alive, hence the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil

from scalelab.lab.core.peak_memory import tree_rss
from scalelab.lab.core.sampling import SamplingThread


class MemorySampler(SamplingThread):
    """Samples tree_rss() in a daemon thread; `peak_since(mark)` gives a window's peak."""

    def __init__(self, interval_s: float = 0.02, children_every_s: float = 0.5) -> None:
        super().__init__(interval_s, "rss-sampler")
        # Listing the children scans all of /proc (~2 ms): at every sample that took ~10% of
        # a core. Their RSS is still read at every sample; a child younger than
        # children_every_s is missed until the next refresh.
        self.children_every_s = children_every_s
        self._proc = psutil.Process()
        self._children: list[psutil.Process] = []
        self._children_at = -float("inf")
        self._samples: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def _sample(self) -> None:
        self.sample()

    def sample(self) -> int:
        now = time.perf_counter()
        if now - self._children_at >= self.children_every_s:
            self._children, self._children_at = self._proc.children(recursive=True), now
        rss = tree_rss(self._proc, self._children)
        with self._lock:
            self._samples.append((time.perf_counter(), rss))
        return rss

    def peak_between(self, t0: float, t1: float) -> int:
        with self._lock:
            vals = [r for t, r in self._samples if t0 <= t <= t1]
        return max(vals) if vals else 0

    @property
    def peak(self) -> int:
        with self._lock:
            return max((r for _, r in self._samples), default=0)


@dataclass(kw_only=True)
class StageReport:
    """One stage of one run."""

    name: str
    rows_in: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    peak_memory_bytes: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


class StageMeter:
    """Collects StageReports; `with meter.stage("dedupe", rows_in=n) as st: ... st.rows_out = m`."""

    def __init__(self, sampler: MemorySampler) -> None:
        self.sampler = sampler
        self.stages: list[StageReport] = []

    @contextmanager
    def stage(self, name: str, *, rows_in: int = 0) -> Iterator[StageReport]:
        rep = StageReport(name=name, rows_in=rows_in)
        self.sampler.sample()
        t0 = time.perf_counter()
        try:
            yield rep
        finally:
            self.sampler.sample()
            t1 = time.perf_counter()
            rep.seconds = t1 - t0
            rep.peak_memory_bytes = self.sampler.peak_between(t0, t1)
            self.stages.append(rep)

    def window(self, t0: float, t1: float) -> int:
        """Peak RSS sampled between two perf_counter() instants."""
        return self.sampler.peak_between(t0, t1)

    def add(self, report: StageReport) -> None:
        """Record a stage timed by the caller (e.g. summed over per-file calls)."""
        self.stages.append(report)

    def dominant(self) -> str | None:
        return max(self.stages, key=lambda s: s.seconds).name if self.stages else None
