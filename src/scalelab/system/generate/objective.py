"""Throughput at a latency objective: per-request TPOT and the best setting that meets a p95 bound.

A batching mode is judged the way its users feel it: output tokens per second, but only among
the settings (batch sizes, max_num_seqs) whose p95 time per output token stays within a stated
objective. TPOT is defined once, from a request's own token timestamps, so every engine (ours,
Hugging Face `generate`, one at a time) is measured the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scalelab.lab.core.errors import BadUsageError


def request_tpot(stamps: Sequence[float]) -> float | None:
    """First to last output token over n - 1 (None for fewer than two tokens: no gap exists)."""
    if len(stamps) < 2:
        return None
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (the bench's p50/p95); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


@dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One mode at one concurrency setting, measured over the whole workload."""

    mode: str
    """'continuous', 'static' or 'one_at_a_time'."""
    setting: int
    """max_num_seqs (continuous) or the batch size (static); 1 for one at a time."""
    tokens_per_s: float
    """Output tokens over the run's wall time."""
    p95_tpot_s: float
    """p95 over requests of request_tpot."""


@dataclass(frozen=True, kw_only=True)
class TpotBound:
    """A p95 TPOT bound: absolute seconds, or a multiple of a reference mode's p95 TPOT."""

    value: float
    relative: bool = False
    """True: the bound is value x the one-at-a-time p95 TPOT measured in the same run."""

    def __post_init__(self) -> None:
        if not self.value > 0:
            raise BadUsageError(f"the TPOT objective must be > 0, got {self.value}")

    def bound(self, reference_p95_s: float | None) -> float:
        if not self.relative:
            return self.value
        if reference_p95_s is None:
            raise BadUsageError(
                "a relative TPOT objective (e.g. 2.5x) needs the one-at-a-time run: keep 1 in "
                "--sweep or give the objective in seconds"
            )
        return self.value * reference_p95_s

    def __str__(self) -> str:
        return f"{self.value:g}x one-at-a-time" if self.relative else f"{self.value:g} s"


def parse_objective(text: str) -> TpotBound:
    """'0.25' (seconds) or '2.5x' (times the one-at-a-time p95 TPOT of the same run)."""
    raw = text.strip().lower()
    relative = raw.endswith("x")
    try:
        value = float(raw[:-1] if relative else raw)
    except ValueError:
        raise BadUsageError(
            f"--tpot-objective {text!r}: give seconds (0.25) or a multiple of the "
            "one-at-a-time p95 TPOT (2.5x)"
        ) from None
    return TpotBound(value=value, relative=relative)


def best_under_objective(points: Sequence[SweepPoint], bound_s: float) -> SweepPoint | None:
    """The highest tokens/s among points whose p95 TPOT is within bound_s (a tie goes to the
    smaller setting: it holds less memory); None when no setting meets the objective."""
    ok = [pt for pt in points if pt.p95_tpot_s <= bound_s]
    if not ok:
        return None
    return max(ok, key=lambda pt: (pt.tokens_per_s, -pt.setting))
