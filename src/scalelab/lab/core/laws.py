"""The closed-form scaling laws: Amdahl, Gustafson, Karp–Flatt, and the USL curve itself.

Pure functions of numbers; the fits that estimate their parameters live in fits.py and usl.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.lab.core.errors import BadInputError


def _check_fraction(p: float, what: str = "parallel fraction") -> None:
    if not (0.0 <= p <= 1.0) or math.isnan(p):
        raise BadInputError(f"{what} must be between 0 and 1 (got {p}); e.g. 0.95 for 95% parallel")


def _check_workers(n: float) -> None:
    if not n >= 1:
        raise BadInputError(f"worker count must be >= 1 (got {n})")


def amdahl_speedup(p: float, n: float) -> float:
    """Fixed-size speedup on n workers when a fraction p of the work parallelises: 1/((1-p)+p/n)."""
    _check_fraction(p)
    _check_workers(n)
    return 1.0 / ((1.0 - p) + p / n)


def amdahl_limit(p: float) -> float:
    """The speedup as n -> infinity: 1/(1-p) (infinite when p == 1)."""
    _check_fraction(p)
    return math.inf if p == 1.0 else 1.0 / (1.0 - p)


def gustafson_speedup(p: float, n: float) -> float:
    """Scaled speedup when the parallel part grows with n: (1-p) + p*n (p measured on n workers)."""
    _check_fraction(p)
    _check_workers(n)
    return (1.0 - p) + p * n


def efficiency(speedup: float, n: float) -> float:
    """Parallel efficiency: speedup per worker."""
    _check_workers(n)
    return speedup / n


def karp_flatt(speedup: float, n: float) -> float:
    """Experimentally determined serial fraction e = (1/S - 1/n) / (1 - 1/n), for n > 1.

    Rising e with n points at overhead (communication, contention) rather than a fixed serial
    phase, which would keep e constant.
    """
    if not n > 1:
        raise BadInputError(f"Karp–Flatt needs n > 1 workers (got {n})")
    if not speedup > 0:
        raise BadInputError(f"speedup must be > 0 (got {speedup})")
    return (1.0 / speedup - 1.0 / n) / (1.0 - 1.0 / n)


def usl_throughput(n: float, gamma: float, alpha: float, beta: float) -> float:
    """Universal Scalability Law: X(N) = γN / (1 + α(N−1) + βN(N−1))."""
    return gamma * n / (1.0 + alpha * (n - 1.0) + beta * n * (n - 1.0))


@dataclass(frozen=True, kw_only=True)
class LawRow:
    workers: float
    speedup: float
    efficiency: float


@dataclass(frozen=True, kw_only=True)
class LawTable:
    """Speedup and efficiency per worker count under one law."""

    law: str
    parallel_fraction: float
    rows: list[LawRow]
    limit: float
    """Speedup as n -> infinity (Amdahl: 1/(1-p); Gustafson: unbounded)."""


def amdahl_table(p: float, workers: list[float]) -> LawTable:
    rows = []
    for n in workers:
        s = amdahl_speedup(p, n)
        rows.append(LawRow(workers=n, speedup=s, efficiency=s / n))
    return LawTable(law="amdahl", parallel_fraction=p, rows=rows, limit=amdahl_limit(p))


def gustafson_table(p: float, workers: list[float]) -> LawTable:
    rows = []
    for n in workers:
        s = gustafson_speedup(p, n)
        rows.append(LawRow(workers=n, speedup=s, efficiency=s / n))
    return LawTable(
        law="gustafson", parallel_fraction=p, rows=rows, limit=math.inf if p > 0 else 1.0
    )
