"""The spread of a metric between runs of one unchanged setup, and the interval it gives B/A.

Separate runs of one server differ by more than their own latencies say: on this shared
machine the p50 of one 2 s run of a 10 ms server moved 4–9% (log standard deviation) from run
to run, while the run's 10 slices put its standard error at 1.3–1.4% and showed no correlation
from slice to slice (lag-1 autocorrelation +0.02 to +0.04; benchmarks/bench_compare.py,
docs/compare.md). The
machine's state holds for a whole run and changes between runs, so nothing inside one run can
see it: a run is one draw of a random level, log x_run = μ + u_run + e_run, and the variance
of u + e is measured only by repeating runs.

`--noise RUNS` gives compare such repeats: records of 2 or more runs of one unchanged setup
at each level (the same duration and rate as A's and B's runs, on the same machine). At each
level their log values' sum of squares about the level's mean, pooled over the levels and with
the compared sides' own repeats, is s² with Σ(runs − 1) degrees of freedom, and B/A gets the
two-sample t interval on the mean logs,

    exp(mean log B − mean log A ± t(df) · s · √(1/n_A + 1/n_B)),

one run a side included (n = 1): the interval a pooled variance from independent runs gives,
on the assumption that A, B and the calibration runs spread alike between runs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalelab.lab.compare.intervals import Interval
from scalelab.lab.compare.sides import group, read_side, run_values
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.records import Record


@dataclass(frozen=True)
class Spread:
    """A metric's spread between runs: log values' squares about each level's mean."""

    ss: float
    """Sum of squared deviations of log values from their level's mean."""
    df: int
    """Σ over levels of (runs − 1)."""
    runs: int
    """Runs measured (of all levels)."""

    @property
    def sd(self) -> float:
        """The log standard deviation of one run (≈ its coefficient of variation)."""
        return math.sqrt(self.ss / self.df)


def _ss(values: Sequence[float]) -> float:
    x = np.log(np.asarray(values, dtype=float))
    return float(((x - x.mean()) ** 2).sum())


def spreads(records: list[Record]) -> dict[str, Spread]:
    """Each metric's spread over the levels with 2+ valid runs (a run its load tester judged
    invalid measured its own lateness, not the setup's noise)."""
    ss: dict[str, float] = defaultdict(float)
    df: dict[str, int] = defaultdict(int)
    runs: dict[str, int] = defaultdict(int)
    for recs in group([r for r in records if r.ok]).values():
        per = [run_values(r) for r in recs]
        for m in set.intersection(*(set(p) for p in per)):
            vals = [p[m] for p in per]
            if len(vals) >= 2 and min(vals) > 0:
                ss[m] += _ss(vals)
                df[m] += len(vals) - 1
                runs[m] += len(vals)
    return {m: Spread(ss[m], df[m], runs[m]) for m in ss if df[m] > 0}


@dataclass(frozen=True)
class Pooled:
    """B/A over runs with the between-run variance pooled from calibration runs and the
    sides' own repeats: the two-sample t on the mean logs."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    cal: Spread

    @property
    def df(self) -> int:
        return self.cal.df + len(self.a) - 1 + len(self.b) - 1

    @property
    def sd(self) -> float:
        """The pooled log standard deviation of one run."""
        return math.sqrt((self.cal.ss + _ss(self.a) + _ss(self.b)) / self.df)

    def point(self) -> float:
        return math.exp(float(np.log(self.b).mean() - np.log(self.a).mean()))

    def ratio(self, alpha: float) -> Interval:
        from scipy.special import stdtrit

        d = math.log(self.point())
        half = float(stdtrit(self.df, 1.0 - alpha / 2.0)) * self.sd * math.sqrt(
            1.0 / len(self.a) + 1.0 / len(self.b))
        lo, hi = d - half, d + half
        return (math.exp(lo) if lo > -700 else 0.0), (math.exp(hi) if hi < 700 else math.inf)


def noise_of(path: Path) -> dict[str, Spread]:
    """`--noise PATH`: the spreads of its records, which must repeat some level."""
    got = spreads(read_side(path))
    if not got:
        raise BadInputError(f"{path}: no level with 2 or more valid runs; record repeated runs "
                            "of one unchanged setup (e.g. load ... --records F, run twice)")
    return got
