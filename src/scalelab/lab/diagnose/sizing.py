"""Sequential sizing: a load level runs in chunks until each of its objectives is decided, or
its share of the time runs out.

A chunk is one load step (its own warm-up, then a measured window); after each, the chunks so
far are merged exactly (latency histograms added, counters summed: core.sheet then reads one
record per level and repeat) and the level's objectives are decided by the verdict's own rules
(core.objectives.check_rows: order statistics for quantiles, Clopper–Pearson for rates). The
level stops when none is undecided; otherwise the next chunk is sized to the samples the
undecided checks need at the rate measured so far (or doubles what was measured when their
rules give no count), cut to what the share has left after the chunk overhead the last one
showed; with `paid_only` (the llm and serve stages) to the largest count
that share pays, the level stopping when it pays none. The merged record keeps how it was
sized in extras["sizing"]: chunks, samples, seconds spent of the share, why it stopped, and
each objective left undecided with what deciding it needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from scalelab.lab.core.objectives import Check, Objective, check_rows
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.signals import LATENCY_HISTOGRAM
from scalelab.lab.core.verdict import SAMPLES_RATE_KEY, samples_needed
from scalelab.lab.diagnose.budget import SIZING_KEY
from scalelab.lab.load.http.result import merge_records


def pending(record: Record, objectives: list[Objective]) -> list[Check]:
    """The level's checks more measurement could still decide (undecided ones)."""
    return [c for c in check_rows(build_sheet([record]), objectives)
            if c.outcome == "undecided"]


def counts(record: Record, objectives: list[Objective]) -> tuple[list[int], bool]:
    """The samples the level needs in all for each undecided check whose rule gives a count
    (`core.verdict.samples_needed`: 59 for a p95, 299 for a p99 or for 99% availability
    without a failure), and whether some undecided check gives none (a bound straddling the
    limit: more samples may still decide it)."""
    rows = build_sheet([record])
    row = rows[0] if rows else None
    got = [samples_needed(c, row) for c in check_rows(rows, objectives)
           if c.outcome == "undecided"]
    return [n for n in got if n is not None], any(n is None for n in got)


NEED_MARGIN = 1.1
"""A chunk sized to a count of samples asks this much more time than the rate measured so far
says it takes: a chunk that falls a few samples short costs another chunk's start-up."""


def next_seconds(*, have: int | None, need: int | None, measured_s: float, first_s: float,
                 left_s: float) -> float:
    """The next chunk's window (pure): the samples still needed at the rate measured so far
    (with NEED_MARGIN) when the undecided checks give a count, else as long as everything
    measured (doubling keeps the chunks' fixed cost a shrinking share); never under `first_s`,
    cut to `left_s`."""
    if need is not None and have and measured_s > 0 and need > have:
        want = (need - have) / (have / measured_s) * NEED_MARGIN
    else:
        want = measured_s
    return min(max(want, first_s), left_s)


def paid_need(needs: list[int], *, have: int | None, measured_s: float,
              left_s: float) -> int | None:
    """The largest count of samples the time left pays at the rate measured so far, with
    NEED_MARGIN (pure): 45 samples in 8.4 s (5.36/s) with 20 s left pay a p95's 59 (14 more,
    2.87 s) but not 99% availability's 299 (254 more, 52.1 s), so the next chunk is sized to 59
    and the availability check is left to a larger budget. None when none is paid (or no rate
    is measured yet)."""
    if not have or measured_s <= 0:
        return None
    per_s = have / measured_s
    paid = [n for n in needs if max(0, n - have) / per_s * NEED_MARGIN <= left_s]
    return max(paid) if paid else None


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
    """'decided', 'time share spent', 'a chunk failed' or `UNPAID`."""
    undecided: list[str]
    """'<objective>: <what deciding it needs>' for each check left undecided."""
    measured_s: float = 0.0
    """Seconds of the chunks' measured windows together."""

    @property
    def samples_per_s(self) -> float | None:
        """Samples over the chunks' measured windows: the rate the level sustained, what
        the time to decide an undecided check is read from (a first chunk measured in a step
        with other levels spent none of the level's own seconds, so spent_s cannot be it)."""
        return (self.samples / self.measured_s if self.samples and self.measured_s > 0
                else None)

    def as_dict(self) -> dict[str, Any]:
        """The record's extras["sizing"]."""
        per_s = self.samples_per_s
        return {"chunks": self.chunks, "samples": self.samples,
                "spent_s": round(self.spent_s, 3), "share_s": round(self.share_s, 3),
                "stopped": self.stopped, "undecided": self.undecided,
                "samples_per_s": None if per_s is None else round(per_s, 3)}


UNPAID = "share cannot pay the samples still needed"
"""Why a `paid_only` level stopped with its share not spent (`Sizing.stopped`)."""

Chunk = Callable[[float, int], Record | None]
"""Run one chunk of `seconds` measured time (the index counts from 0); its record, or None
when the step failed."""


def _asked(record: Record, seconds: float) -> float:
    return seconds


def size_level(run_chunk: Chunk, objectives: list[Objective], *, first_s: float,
               share_s: float, clock: Callable[[], float] = time.monotonic,
               merge: Callable[[list[Record]], Record] = merge_records,
               window: Callable[[Record, float], float] = _asked,
               overhead_s: float = 0.0, paid_only: bool = False) -> Record | None:
    """Run chunks of one level until no objective is undecided or `share_s` is spent (the first
    chunk, `first_s` long, always runs); the merged record with extras["sizing"], or None when
    the first chunk failed. A later chunk that fails ends the level with what it measured.

    `merge`: how chunks become one record (each result type's `merge_records`: a load run's
    by default; the llm stage's, load.llm.result's, has four histograms).
    `window(record, asked_s)`: the seconds a chunk measured (default: what it was asked; a
    chunk of N requests, like the llm stage's first, measures its record's wall_s).
    `overhead_s`: a chunk's fixed cost (start-up, warm-up) beside its window, at least (a
    first chunk measured elsewhere, e.g. in one step with other levels, shows none).
    `paid_only`: a later chunk is sized to the largest count the share still pays
    (`paid_need`), and the level stops, its share left to what comes after it, when every
    undecided check gives a count the share cannot pay (stopped "share cannot pay the samples
    still needed"); without it, chunks run toward the largest count until the share is spent
    (a chunk that cannot reach it may still show a miss)."""
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
        said = merged.extras.get("samples")
        have = int(said) if isinstance(said, int | float) else None
        needs, open_ended = counts(merged, objectives)
        need = max(needs) if needs else None
        if paid_only and needs:
            need = paid_need(needs, have=have, measured_s=measured, left_s=left)
            if need is None and not open_ended:
                stopped = UNPAID
                break
        seconds = next_seconds(have=have, need=need, measured_s=measured, first_s=first_s,
                               left_s=left)
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
                   pending(merged, objectives)], measured_s=measured)
    rate = {SAMPLES_RATE_KEY: round(sizing.samples_per_s, 3)} if sizing.samples_per_s else {}
    return merged.model_copy(update={"extras": {**merged.extras, **rate,
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

    def left_s(self) -> float:
        """Seconds the stage's levels have left: its share less what it spent and its later
        fixed work (`reserve_s`); `cap_s` without a budget."""
        if self._t0 is None:
            self._t0 = self.clock()
        if self.share_s is None:
            return self.cap_s
        return max(0.0, self.share_s - (self.clock() - self._t0) - self.reserve_s)

    def next_share(self) -> float:
        if self._t0 is None:
            self._t0 = self.clock()
        left_levels = max(1, self.levels - self._done)
        self._done += 1
        if self.share_s is None:
            return self.cap_s
        left = self.share_s - (self.clock() - self._t0) - self.reserve_s
        return max(0.0, left / left_levels)


Outcome = Literal["met", "missed", "undecided"]
"""A level's objectives together: all decided met, one decided missed, or neither yet."""


def level_outcome(record: Record, objectives: list[Objective]) -> Outcome:
    """One level's record judged by the verdict's own rules (`check_rows`): "missed" when a
    check is decided missed, "met" when none is missed or undecided (an objective the record
    does not measure cannot be decided by more load), else "undecided"."""
    outcomes = {c.outcome for c in check_rows(build_sheet([record]), objectives)}
    if "missed" in outcomes:
        return "missed"
    return "undecided" if "undecided" in outcomes else "met"


def curve_point(r: Record) -> Record:
    """A level measured once to draw the curve, not to decide it (`Record.purpose`)."""
    return r.model_copy(update={"purpose": "curve"})


def target_level(levels: list[float], target: float) -> float:
    """The level a stage decides first (pure): its target, else the highest level under it
    (a run that stops short of the target decides where it stops), else the lowest."""
    ordered = sorted(levels)
    under = [x for x in ordered if x <= target * (1 + 1e-9)]
    return under[-1] if under else ordered[0]


@dataclass(kw_only=True)
class TargetDecision:
    """How a stage's levels were decided: the target first, then a bisection for the first
    level that misses (`decide_target`)."""

    target: float
    order: list[float] = field(default_factory=list)
    """The levels measured to a decision, in the order they were."""
    outcomes: dict[float, Outcome] = field(default_factory=dict)
    first_miss: float | None = None
    """The lowest level decided missed with every level under it decided met or bisected
    away (None: the target holds, or the bisection was left undecided)."""

    @property
    def holds(self) -> bool:
        return self.outcomes.get(self.target) == "met"


def bisection_steps(n: int) -> int:
    """Levels a bisection over `n` candidates measures at most (pure): ceil(log2(n + 1))."""
    return math.ceil(math.log2(n + 1)) if n > 0 else 0


def decide_target(levels: list[float], target: float,
                  outcome: Callable[[float, int], Outcome]) -> TargetDecision:
    """Decide a stage's target first, then bisect for its first miss (adaptive, pure given
    `outcome`). `outcome(level, probes_left)` measures one level until decided (or its share
    is spent), `probes_left` counting it and the levels still to come at most, so it can give
    the level its part of the time left.

    The target is measured first. If it holds, nothing else is decided (the others are
    curve points). If it misses, the first failing level is searched by bisection over the
    levels under it, assuming a level that misses misses at every higher level: levels
    [1, 2, 5, 10] with 10 missed measure 2, then 5 (2 met) or 1 (2 missed). An undecided
    level ends the bisection there (its share was spent): the bracket is left open."""
    ordered = sorted(levels)
    t = target_level(ordered, target)
    d = TargetDecision(target=t)
    hi = ordered.index(t)
    lo = 0
    d.order.append(t)
    d.outcomes[t] = outcome(t, 1 + bisection_steps(hi))
    if d.outcomes[t] != "missed":
        return d
    while lo < hi:
        mid = (lo + hi) // 2
        level = ordered[mid]
        d.order.append(level)
        got = d.outcomes[level] = outcome(level, bisection_steps(hi - lo))
        if got == "undecided":
            return d
        if got == "missed":
            hi = mid
        else:
            lo = mid + 1
    d.first_miss = ordered[hi]
    return d


def _sent(r: Record) -> float:
    """The arrival rate a load step sent (its `sent_rps`), else the rate it was asked."""
    sent = r.extras.get("sent_rps")
    return float(sent) if isinstance(sent, int | float) and sent > 0 else r.level


def search_decides(steps: list[Record], objectives: list[Objective],
                   target_rate: float) -> Record | None:
    """The capacity search's evidence that decides a target of `target_rate` (pure): the
    lowest valid step that sent at least that rate whose record meets every objective by the
    verdict's rules (`level_outcome`); else every step that sent at least that rate (valid,
    or flagged for generator lag) and was not decided missed, merged (`merge_records`:
    histograms added, counts summed), when the merge meets every objective; None when
    neither does. Both rest on the assumption that latency and failures do not fall as load
    rises (a rate that holds at 800 requests/s holds at 400), which the stage states beside
    it: under it each such step's latencies bound the target's from above, so their sum does
    too, and 99.9% availability, which no 1 s step of a few hundred requests can show, is
    decided by the steps together."""
    above = sorted((r for r in steps if _sent(r) >= target_rate * (1 - 1e-9)),
                   key=lambda r: r.level)
    one = next((r for r in above if r.ok and level_outcome(r, objectives) == "met"), None)
    if one is not None:
        return one
    # A step flagged for generator lag sent its arrivals bunched at its rate: a harsher load,
    # so it bounds the target from above too; its rate is what it sent, not what it asked.
    kept = [r for r in above if level_outcome(r, objectives) != "missed"]
    if len(kept) < 2 or any(LATENCY_HISTOGRAM not in r.histograms for r in kept):
        return None
    merged = merge_records(kept)
    if level_outcome(merged, objectives) != "met":
        return None
    return merged.model_copy(update={"level": kept[0].level, "extras": {
        **merged.extras, "merged_steps": [r.level for r in kept]}})
