"""How far one distribution moved from another, defined once: PSI, L-infinity, Jensen-Shannon and
the two-sample Kolmogorov-Smirnov statistic (pure, numpy; scipy for p-values).

Every measure takes counts or proportions alike (each side is normalised to sum 1 first):

- L-infinity, max over values v of |p_ref(v) - p_cur(v)|, in [0, 1] (TFDV's categorical measure).
- Population stability index, sum (q - p) ln(q / p) over shared bins, with proportions below
  `PSI_EPSILON` = 1e-4 raised to it, so a bin empty on one side counts as strong evidence
  (~ p ln(p / 1e-4)) rather than infinity.
- Jensen-Shannon divergence, base 2, in [0, 1] (0 log 0 = 0; no smoothing needed).
- Kolmogorov-Smirnov: `ks_2samp` on raw values (scipy's exact or asymptotic p-value, scipy's
  choice); `ks_counts` from two count tables over ordered keys (histogram buckets), D = max
  |F_ref - F_cur| over the keys, with the asymptotic p-value (Kolmogorov distribution, effective
  n = n m / (n + m)). On the raw values as keys the two give the same D.

data/skew.py (dataset against dataset) and online/features.py (a window against its feature
spec's reference) both call these.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any, TypeVar

import numpy as np

PSI_EPSILON = 1e-4
"""Proportion used in place of anything smaller (an empty bin) in PSI."""

K = TypeVar("K", bound=Hashable)


def _proportions(x: np.ndarray) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    total = float(a.sum())
    return a / total if total else np.zeros_like(a)


def psi(ref: np.ndarray, cur: np.ndarray, eps: float = PSI_EPSILON) -> float:
    """Population stability index of `cur` against `ref` (counts or proportions per shared bin)."""
    p = np.maximum(_proportions(ref), eps)
    q = np.maximum(_proportions(cur), eps)
    return float(np.sum((q - p) * np.log(q / p)))


def js_divergence(ref: np.ndarray, cur: np.ndarray) -> float:
    """Jensen-Shannon divergence (base 2) of two count or proportion vectors."""
    p, q = _proportions(ref), _proportions(cur)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return max(0.0, 0.5 * kl(p) + 0.5 * kl(q))


def linf(ref: Mapping[str, float], cur: Mapping[str, float]) -> tuple[float, str | None]:
    """L-infinity distance between two count (or share) tables, and the value where it is
    attained (the first in sorted order on a tie; None when the distance is 0)."""
    nr, nc = sum(ref.values()), sum(cur.values())
    best, where = 0.0, None
    for v in sorted(set(ref) | set(cur)):
        d = abs((ref.get(v, 0) / nr if nr else 0.0) - (cur.get(v, 0) / nc if nc else 0.0))
        if d > best:
            best, where = d, v
    return best, where


def ks_counts(ref: Mapping[K, float], cur: Mapping[K, float]) -> tuple[float, float]:
    """KS statistic between two count tables over ordered keys, and its asymptotic p-value."""
    from scipy.special import kolmogorov

    nr, nc = sum(ref.values()), sum(cur.values())
    if not nr or not nc:
        raise ValueError("a KS statistic needs values on both sides")
    fr = fc = d = 0.0
    keys: Any = set(ref) | set(cur)
    for key in sorted(keys):
        fr += ref.get(key, 0) / nr
        fc += cur.get(key, 0) / nc
        d = max(d, abs(fr - fc))
    en = nr * nc / (nr + nc)
    return d, float(kolmogorov(d * math.sqrt(en)))


def ks_2samp(ref: np.ndarray, cur: np.ndarray) -> tuple[float, float]:
    """scipy's two-sample KS test on raw values: (statistic, p-value)."""
    from scipy import stats

    res: Any = stats.ks_2samp(ref, cur)
    return float(res.statistic), float(res.pvalue)
