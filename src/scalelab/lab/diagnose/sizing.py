"""Sequential sizing: a load level runs in chunks until each of its objectives is decided, or
its share of the time runs out.

A chunk is one load step (its own warm-up, then a measured window); after each, the chunks so
far are merged exactly (latency histograms added, counters summed: core.sheet then reads one
record per level and repeat) and the level's objectives are decided by the verdict's own rules
(core.objectives.check_rows: order statistics for quantiles, Clopper–Pearson for rates). The
level stops when none is undecided; otherwise the next chunk doubles what was measured, cut to
what the share has left after the chunk overhead the last one showed. The merged record keeps
how it was sized in extras["sizing"]: chunks, samples, seconds spent of the share, why it
stopped, and each objective left undecided with what deciding it needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalelab.lab.core.objectives import Check, Objective, check_rows
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.diagnose.budget import SIZING_KEY
from scalelab.lab.load.http.result import merge_records


def pending(record: Record, objectives: list[Objective]) -> list[Check]:
    """The level's checks more measurement could still decide (undecided ones)."""
    return [c for c in check_rows(build_sheet([record]), objectives)
            if c.outcome == "undecided"]


@dataclass(kw_only=True)
class Sizing:
    """How one level was sized."""

    chunks: int
    samples: int | None
    spent_s: float
    """Wall seconds of the level's steps (warm-ups and process starts included)."""
    share_s: float
    """The seconds the level was allowed."""
    stopped: str
    """'decided', 'time share spent' or 'a chunk failed'."""
    undecided: list[str]
    """'<objective>: <what deciding it needs>' for each check left undecided."""

    def as_dict(self) -> dict[str, Any]:
        return {"chunks": self.chunks, "samples": self.samples,
                "spent_s": round(self.spent_s, 3), "share_s": round(self.share_s, 3),
                "stopped": self.stopped, "undecided": self.undecided}


Chunk = Callable[[float, int], Record | None]
"""Run one chunk of `seconds` measured time (the index counts from 0); its record, or None
when the step failed."""


def _asked(record: Record, seconds: float) -> float:
    return seconds


def size_level(run_chunk: Chunk, objectives: list[Objective], *, first_s: float,
               share_s: float, clock: Callable[[], float] = time.monotonic,
               merge: Callable[[list[Record]], Record] = merge_records,
               window: Callable[[Record, float], float] = _asked,
               overhead_s: float = 0.0) -> Record | None:
    """Run chunks of one level until no objective is undecided or `share_s` is spent (the first
    chunk, `first_s` long, always runs); the merged record with extras["sizing"], or None when
    the first chunk failed. A later chunk that fails ends the level with what it measured.

    `merge`: how chunks become one record (each result type's `merge_records`: a load run's
    by default; the llm stage's, load.llm.result's, has four histograms).
    `window(record, asked_s)`: the seconds a chunk measured (default: what it was asked; a
    chunk of N requests, like the llm stage's first, measures its record's wall_s).
    `overhead_s`: a chunk's fixed cost (start-up, warm-up) beside its window, at least (a
    first chunk measured elsewhere, e.g. in one step with other levels, shows none)."""
    t0 = clock()
    chunks: list[Record] = []
    measured = 0.0
    seconds = first_s
    stopped = "time share spent"
    while True:
        start = clock()
        rec = run_chunk(seconds, len(chunks))
        took = clock() - start
        if rec is None:
            stopped = "a chunk failed"
            break
        chunks.append(rec)
        got = window(rec, seconds)
        measured += got
        merged = merge(chunks)
        if not pending(merged, objectives):
            stopped = "decided"
            break
        overhead = max(overhead_s, took - got)
        left = share_s - (clock() - t0) - overhead
        # Doubling keeps the chunks' fixed cost (start-up, warm-up) a shrinking share; never
        # under first_s (a first chunk that counted requests may have measured less).
        seconds = min(max(measured, first_s), left)
        if seconds < first_s / 2:
            break
    if not chunks:
        return None
    merged = merge(chunks)
    samples = merged.extras.get("samples")
    sizing = Sizing(
        chunks=len(chunks), samples=int(samples) if isinstance(samples, int | float) else None,
        spent_s=clock() - t0, share_s=share_s, stopped=stopped,
        undecided=[f"{c.objective.label}: {c.decision.need}" for c in
                   pending(merged, objectives)])
    return merged.model_copy(update={"extras": {**merged.extras,
                                                SIZING_KEY: sizing.as_dict()}})


@dataclass(kw_only=True)
class LevelClock:
    """Hands each of a stage's sized levels its share of the stage's time, as they run: what
    is left of the stage's share, less what its later fixed work needs (`reserve_s`), over the
    levels still to run, so time a decided level did not use goes to the later ones."""

    share_s: float | None
    """The stage's share of the budget; None: no budget (each level gets `cap_s`)."""
    levels: int
    """How many sized levels the stage runs."""
    cap_s: float
    """A level's share without a budget (one chunk's time, or --full's cap per level)."""
    reserve_s: float = 0.0
    """Seconds the stage's other work after its levels needs (capacity searches, sweeps)."""
    clock: Callable[[], float] = time.monotonic
    _t0: float | None = None
    _done: int = 0

    def start(self) -> None:
        """Count the stage's time from now (default: from the first level's share), so
        the work before its first level (a step measuring every level's first chunk) is
        paid from the share too."""
        self._t0 = self.clock()

    def next_share(self) -> float:
        if self._t0 is None:
            self._t0 = self.clock()
        left_levels = max(1, self.levels - self._done)
        self._done += 1
        if self.share_s is None:
            return self.cap_s
        left = self.share_s - (self.clock() - self._t0) - self.reserve_s
        return max(0.0, left / left_levels)
