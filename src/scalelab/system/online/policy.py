"""Update policies (when to refresh the model), as small pure objects the updater asks at each
window close: never; a fixed period (every k windows); drift-triggered (a Page-Hinkley test on
the live model's errors as late labels arrive, with a minimum gap between updates, and a
back-off after refused candidates).

Why the back-off: a candidate the gate refuses leaves the stale model live, so its errors stay
high and the detector, restarted on them, fires again within a window or two; the next
candidate is fine-tuned on a lookback that differs from the refused one's by a day, and the gate
refuses it for the same reason (on May-December 2013, threshold 100: 49 of 58 attempts refused,
44 on one class's F1). After r refusals in a row the drift policy waits min_gap x 2**r windows
(`backoff_wait`), never longer than the lookback (by then a candidate trains on labels no refused
one saw), and needs a fresh signal from errors observed after the refusal. A promotion or a
rollback restarts the count. Fixed periods keep their period: that is what they promise.

Page-Hinkley (Page 1954; the form in river.drift.PageHinkley): for a stream x_t with running
mean xbar_t, m_t = sum_{i<=t} (x_i - xbar_i - delta); it signals an increase of the mean when
m_t - min_{i<=t} m_i > threshold, then restarts. On 0/1 errors, delta is the smallest rise in
error rate worth reacting to and threshold is how much evidence (in errors) it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from scalelab.lab.core.errors import BadInputError


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
        """The live model changed (a promotion or a rollback): restart what measured the old
        one."""

    def refused(self) -> None:
        """An update was attempted and refused: the old model stays live."""


def backoff_wait(refusals: int, *, min_gap: int = 1, factor: float = 2.0,
                 cap: int = 7) -> int:
    """Windows to wait after an attempt, given the refusals in a row so far (pure):
    min_gap x factor**refusals, at most `cap` (but never under min_gap).
    min_gap 1, factor 2, cap 7: 1, 2, 4, 7, 7, ..."""
    if not factor >= 1:
        raise BadInputError(f"the drift back-off factor must be >= 1 (1: no back-off, 2: the "
                            f"default doubling), got {factor}")
    if refusals < 0 or min_gap < 1 or cap < 1:
        raise BadInputError(f"back-off needs refusals >= 0, min_gap >= 1 and max_wait >= 1 "
                            f"window; got {refusals}, {min_gap}, {cap}")
    # compare in floats before ceil: factor**refusals overflows int conversion for long runs
    grown = min_gap * factor ** min(refusals, 64)
    return max(min_gap, min(cap, math.ceil(grown)))


class _Blind:
    """A policy blind to the live model: its errors, updates and refusals change nothing."""

    def observe(self, errors: np.ndarray) -> None:
        pass

    def updated(self) -> None:
        pass

    def refused(self) -> None:
        pass


@dataclass(kw_only=True)
class Never(_Blind):
    name: str = "never"

    def decide(self, window: int, last_update: int | None) -> tuple[bool, str]:
        return False, "policy never updates"


@dataclass(kw_only=True)
class Periodic(_Blind):
    every: int
    """Update at every `every`-th window close (1 = each window)."""
    name: str = ""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise BadInputError(f"a fixed period must be >= 1 window, got {self.every}")
        self.name = self.name or f"every-{self.every}"

    def decide(self, window: int, last_update: int | None) -> tuple[bool, str]:
        due = (window + 1) % self.every == 0
        return due, (f"fixed period: due every {self.every} window(s)" if due
                     else "fixed period: not due")


@dataclass(kw_only=True)
class Drift:
    """Update when Page-Hinkley signals a rise in the live model's error rate; back off after
    refused candidates."""

    detector: PageHinkley = field(default_factory=PageHinkley)
    min_gap: int = 1
    """Windows between two updates at least (a signal inside the gap waits)."""
    max_age: int | None = None
    """Update anyway after this many windows without one (None: only on drift)."""
    backoff: float = 2.0
    """After r refused attempts in a row, wait min_gap x backoff**r windows before the next
    (1: no back-off). 2 by rule, the usual exponential back-off: the waits after a run of
    refusals add up to under twice the last one, so it at most doubles the reaction time to a
    drift that a later candidate would answer, while a long run of refusals costs one attempt
    per `max_wait` windows instead of one per window."""
    max_wait: int = 7
    """The longest back-off, in windows: the lookback's span (7 daily windows for the default
    7-day lookback; `UpdaterConfig.lookback_windows`). By then the lookback holds only labels
    the refused candidates never saw; a longer wait would skip labels no candidate trains on."""
    name: str = "drift"
    pending: str | None = None
    refusals: int = 0
    """Refused attempts since the last promotion or rollback."""

    def __post_init__(self) -> None:
        backoff_wait(0, min_gap=self.min_gap, factor=self.backoff, cap=self.max_wait)

    def wait(self) -> int:
        """Windows the next attempt waits after the last one."""
        return backoff_wait(self.refusals, min_gap=self.min_gap, factor=self.backoff,
                            cap=self.max_wait)

    def observe(self, errors: np.ndarray) -> None:
        hits = self.detector.update(errors)
        if hits and self.pending is None:
            self.pending = f"Page-Hinkley signalled an error-rate rise ({len(hits)} signal(s))"

    def decide(self, window: int, last_update: int | None) -> tuple[bool, str]:
        age = window - (last_update if last_update is not None else -1)
        wait = self.wait()
        if self.pending is not None and age >= wait:
            why = self.pending
            if self.refusals:
                why += (f" after {self.refusals} refused attempt(s) in a row and a {wait}-window "
                        "back-off")
            return True, why
        if self.max_age is not None and age >= self.max_age:
            return True, f"no update for {age} windows (max_age {self.max_age})"
        if self.pending is None:
            return False, "no drift signalled"
        if self.refusals:
            return False, (f"drift: backing off {wait} windows after {self.refusals} refused "
                           "attempt(s) in a row")
        return False, "drift within min_gap"

    def updated(self) -> None:
        self.pending = None
        self.refusals = 0
        self.detector.reset()

    def refused(self) -> None:
        # The signal was answered (by a refusal): the next must come from errors seen after it.
        self.pending = None
        self.refusals += 1
        self.detector.reset()


PolicyName = Literal["never", "monthly", "weekly", "daily", "drift"]
PERIODS = {"daily": 1, "weekly": 7, "monthly": 30}
"""Fixed periods in daily windows (a month is 30 days here)."""


def make_policy(name: str, *, threshold: float = 50.0, delta: float = 0.005,
                min_gap: int = 1, max_age: int | None = None, backoff: float = 2.0,
                max_wait: int = 7) -> Policy:
    """never, daily, weekly, monthly, every-K (K daily windows), drift (Page-Hinkley at
    `threshold`) or drift:T (threshold T); `backoff` and `max_wait` as in `Drift`."""
    backoff_wait(0, min_gap=min_gap, factor=backoff, cap=max_wait)  # bad values fail for any name
    if name == "never":
        return Never()
    if name in PERIODS:
        return Periodic(every=PERIODS[name], name=name)
    if name.startswith("every-") and name[6:].isdigit():
        return Periodic(every=int(name[6:]))
    if name == "drift":
        return Drift(detector=PageHinkley(delta=delta, threshold=threshold), min_gap=min_gap,
                     max_age=max_age, backoff=backoff, max_wait=max_wait)
    if name.startswith("drift:"):
        try:
            t = float(name[6:])
        except ValueError:
            t = -1.0
        if t > 0:
            return Drift(detector=PageHinkley(delta=delta, threshold=t), min_gap=min_gap,
                         max_age=max_age, backoff=backoff, max_wait=max_wait, name=name)
    raise BadInputError(f"policy {name!r} must be never, daily, weekly, monthly, every-K, drift "
                        "or drift:THRESHOLD (Page-Hinkley threshold, e.g. drift:150)")
