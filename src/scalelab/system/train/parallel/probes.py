"""What the transformer loop measures around its steps, one small object each: the RSS
timeline, the profiled window's communication, the step log (and the pipeline bubble read
from it). The loop calls them; each keeps its own state and writes its part of the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.system.train.metrics import peak_rss_bytes
from scalelab.system.train.parallel.measure import (
    CommStats,
    comm_from_events,
    profiler_events,
    rss_status,
)
from scalelab.system.train.parallel.pipeline import bubble_theory


class RssTimeline:
    """The resident set and its high-water mark at each point of the run."""

    def __init__(self) -> None:
        self.before_model = peak_rss_bytes()
        self.points: list[tuple[str, dict[str, int]]] = [("before model", rss_status())]

    def mark(self, label: str) -> None:
        self.points.append((label, rss_status()))

    def report(self) -> dict[str, Any]:
        return {"rss_before_model_bytes": self.before_model,
                "rss_timeline": [[label, st.get("rss"), st.get("hwm"), st.get("malloc_free")]
                                 for label, st in self.points]}


class CommWindow:
    """torch.profiler over the steps of `window`: communication per kind, and the peak RSS read
    just before it starts (its event buffers add ~130 MiB that the allocator keeps after)."""

    def __init__(self, window: range) -> None:
        self.window = window
        self.comm = CommStats()
        self.walls: list[float] = []
        self.train_peak: int | None = None
        self._prof: Any = None

    def enter(self, step: int) -> None:
        if step not in self.window:
            return
        if self.train_peak is None:
            self.train_peak = peak_rss_bytes()
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        self._prof.__enter__()

    def exit(self, wall: float) -> bool:
        """Stop the profiler of this step, if one runs; whether it did."""
        if self._prof is None:
            return False
        self._prof.__exit__(None, None, None)
        c = comm_from_events(profiler_events(self._prof))
        self._prof = None
        for k in c.calls:
            self.comm.calls[k] += c.calls[k]
            self.comm.seconds[k] += c.seconds[k]
            self.comm.bytes[k] += c.bytes[k]
        self.walls.append(wall)
        return True

    def report(self) -> dict[str, Any]:
        n = len(self.walls)
        comm_s = self.comm.total_seconds() / n if n else None
        wall = float(np.mean(self.walls)) if n else None
        return {
            "peak_rss_bytes": peak_rss_bytes() if self.train_peak is None else self.train_peak,
            "peak_rss_profiled_bytes": peak_rss_bytes(),
            "profiled_steps": n, "profiled_step_ms": None if wall is None else 1e3 * wall,
            "comm_ms_per_step": None if comm_s is None else 1e3 * comm_s,
            "compute_ms_per_step": None if comm_s is None or wall is None
            else 1e3 * max(0.0, wall - comm_s),
            "comm": self.comm.per_step(n) if n else {},
        }


@dataclass(kw_only=True)
class StepLog:
    """Per step: the loss this rank holds, the wall times, the pipeline stage's busy time."""

    start: int
    losses: list[float | None] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    sched_s: list[float] = field(default_factory=list)
    """Forward + backward only (the pipeline schedule's step, without the optimizer)."""
    busy_s: list[tuple[float, float, list[list[Any]], float]] = field(default_factory=list)
    """Per step, pipeline only: chunk wall, chunk CPU, the chunks, process CPU over the step."""
    first_step_unix: float | None = None

    def add(self, loss: float | None, *, wall: float, sched: float) -> None:
        self.losses.append(loss)
        self.step_s.append(wall)
        self.sched_s.append(sched)
        if self.first_step_unix is None:
            self.first_step_unix = time.time()

    def pipeline_report(self, *, stages: int, micro_batches: int, schedule: str,
                        recv_ahead: bool, skip_steps: set[int]) -> dict[str, Any]:
        """The bubble is the schedule's: idle time within forward + backward, the optimizer
        step apart. Left out where others remain: the first step (it also infers the shapes
        between stages) and `skip_steps` (activation counting and profiling slow compute, not
        the transfers)."""
        sched_s, busy_s, start = self.sched_s, self.busy_s, self.start
        skip = {0, *(s - start for s in skip_steps)}
        kept = [i for i in range(len(sched_s)) if i not in skip] \
            or list(range(1, len(sched_s))) or list(range(len(sched_s)))
        step_wall = [sched_s[i] for i in kept]
        busy = [busy_s[i][0] for i in kept]
        cpu = [busy_s[i][1] for i in kept]
        return {
            "stages": stages, "micro_batches": micro_batches, "schedule": schedule,
            "recv_ahead": recv_ahead, "bubble_theory": bubble_theory(stages, micro_batches),
            "bubble_measured": float(np.median([1 - b / w for w, b in zip(step_wall, busy,
                                                                           strict=True)])),
            "busy_ms_per_step": 1e3 * float(np.median(busy)),
            "busy_cpu_ms_per_step": 1e3 * float(np.median(cpu)),
            # Inside a chunk but off the CPU (another process had the core), as a share of the
            # step: idle time theory does not know and a core per stage would not have.
            "descheduled_share": float(np.median([(b - c) / w for w, b, c in zip(
                step_wall, busy, cpu, strict=True)])),
            "process_cpu_share": float(np.median([busy_s[i][3] / sched_s[i] for i in kept])),
            "step_ms": [1e3 * w for w in step_wall],
            # Each kept step's chunks, [kind, micro-batch, cpu_s, wall_s], in the order run:
            # the summary replays every stage's together (pipeline.replay).
            "chunks_by_step": {str(start + i): busy_s[i][2] for i in kept},
        }
