"""Update policies (when to refresh the model), as small pure objects the updater asks at each
window close: never; a fixed period (every k windows); drift-triggered (a Page-Hinkley test on
the live model's errors as late labels arrive, with a minimum gap between updates).

Page-Hinkley (Page 1954; the form in river.drift.PageHinkley): for a stream x_t with running
mean xbar_t, m_t = sum_{i<=t} (x_i - xbar_i - delta); it signals an increase of the mean when
m_t - min_{i<=t} m_i > threshold, then restarts. On 0/1 errors, delta is the smallest rise in
error rate worth reacting to and threshold is how much evidence (in errors) it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from scalelab.core.errors import BadInputError


@dataclass(kw_only=True)
class PageHinkley:
    """Streaming Page-Hinkley test for an increase in the mean."""

    delta: float = 0.005
    threshold: float = 50.0
    min_samples: int = 30
    n: int = 0
    mean: float = 0.0
    cum: float = 0.0
    cum_min: float = 0.0

    def __post_init__(self) -> None:
        if self.delta < 0 or self.threshold <= 0 or self.min_samples < 1:
            raise BadInputError("Page-Hinkley needs delta >= 0, threshold > 0, min_samples >= 1")

    def reset(self) -> None:
        self.n, self.mean, self.cum, self.cum_min = 0, 0.0, 0.0, 0.0

    def update(self, values: np.ndarray) -> list[int]:
        """Feed values in order; the positions (in `values`) where a change was signalled.
        The state restarts after each signal."""
        out = []
        for i, x in enumerate(np.asarray(values, dtype=np.float64).tolist()):
            self.n += 1
            self.mean += (x - self.mean) / self.n
            self.cum += x - self.mean - self.delta
            self.cum_min = min(self.cum_min, self.cum)
            if self.n >= self.min_samples and self.cum - self.cum_min > self.threshold:
                out.append(i)
                self.reset()
        return out


def page_hinkley(values: np.ndarray, *, delta: float = 0.005, threshold: float = 50.0,
                 min_samples: int = 30) -> list[int]:
    """Signal positions of Page-Hinkley over a whole sequence (pure)."""
    return PageHinkley(delta=delta, threshold=threshold, min_samples=min_samples).update(values)


class Policy(Protocol):
    name: str

    def observe(self, errors: np.ndarray) -> None:
        """The live model's 0/1 errors on labels that arrived since the last call."""

    def decide(self, window: int, last_update: int | None) -> tuple[bool, str]:
        """Update at the close of window `window`? (and why)."""

    def updated(self) -> None:
        """An update was promoted: restart what measured the old model."""


@dataclass(kw_only=True)
class Never:
    name: str = "never"

    def observe(self, errors: np.ndarray) -> None:
        pass

    def decide(self, window: int, last_update: int | None) -> tuple[bool, str]:
        return False, "policy never updates"

    def updated(self) -> None:
        pass


@dataclass(kw_only=True)
class Periodic:
    every: int
    """Update at every `every`-th window close (1 = each window)."""
    name: str = ""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise BadInputError(f"a fixed period must be >= 1 window, got {self.every}")
        self.name = self.name or f"every-{self.every}"

    def observe(self, errors: np.ndarray) -> None:
        pass

    def decide(self, window: int, last_update: int | None) -> tuple[bool, str]:
        due = (window + 1) % self.every == 0
        return due, (f"fixed period: due every {self.every} window(s)" if due
                     else "fixed period: not due")

    def updated(self) -> None:
        pass


@dataclass(kw_only=True)
class Drift:
    """Update when Page-Hinkley signals a rise in the live model's error rate."""

    detector: PageHinkley = field(default_factory=PageHinkley)
    min_gap: int = 1
    """Windows between two updates at least (a signal inside the gap waits)."""
    max_age: int | None = None
    """Update anyway after this many windows without one (None: only on drift)."""
    name: str = "drift"
    pending: str | None = None

    def observe(self, errors: np.ndarray) -> None:
        hits = self.detector.update(errors)
        if hits and self.pending is None:
            self.pending = f"Page-Hinkley signalled an error-rate rise ({len(hits)} signal(s))"

    def decide(self, window: int, last_update: int | None) -> tuple[bool, str]:
        age = window - (last_update if last_update is not None else -1)
        if self.pending is not None and age >= self.min_gap:
            return True, self.pending
        if self.max_age is not None and age >= self.max_age:
            return True, f"no update for {age} windows (max_age {self.max_age})"
        return False, "no drift signalled" if self.pending is None else "drift within min_gap"

    def updated(self) -> None:
        self.pending = None
        self.detector.reset()


PolicyName = Literal["never", "monthly", "weekly", "daily", "drift"]
PERIODS = {"daily": 1, "weekly": 7, "monthly": 30}
"""Fixed periods in daily windows (a month is 30 days here)."""


def make_policy(name: str, *, threshold: float = 50.0, delta: float = 0.005,
                min_gap: int = 1, max_age: int | None = None) -> Policy:
    """never, daily, weekly, monthly, every-K (K daily windows), drift (Page-Hinkley at
    `threshold`) or drift:T (threshold T)."""
    if name == "never":
        return Never()
    if name in PERIODS:
        return Periodic(every=PERIODS[name], name=name)
    if name.startswith("every-") and name[6:].isdigit():
        return Periodic(every=int(name[6:]))
    if name == "drift":
        return Drift(detector=PageHinkley(delta=delta, threshold=threshold), min_gap=min_gap,
                     max_age=max_age)
    if name.startswith("drift:"):
        try:
            t = float(name[6:])
        except ValueError:
            t = -1.0
        if t > 0:
            return Drift(detector=PageHinkley(delta=delta, threshold=t), min_gap=min_gap,
                         max_age=max_age, name=name)
    raise BadInputError(f"policy {name!r} must be never, daily, weekly, monthly, every-K, drift "
                        "or drift:THRESHOLD (Page-Hinkley threshold, e.g. drift:150)")
