"""Competing models of one resource→throughput curve, chosen by AIC.

- linear:  X = γN                          (ideal scaling; 1 parameter)
- amdahl:  X = γN / (1 + α(N−1))           (a serial fraction α; 2 parameters)
- usl:     X = γN / (1 + α(N−1) + βN(N−1)) (plus coherency β; 3 parameters)

AIC = n·ln(RSS/n) + 2k, with the small-sample correction 2k(k+1)/(n−k−1) when n > k+1. The model
with the lowest AIC is chosen; one extra parameter must buy a real drop in error to win.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from scalelab.lab.core.usl import UslFit, check_xy, fit_usl, usl


@dataclass(frozen=True, kw_only=True)
class ModelFit:
    model: str
    params: dict[str, float]
    k: int
    rss: float
    aic: float
    fitted: list[float]


@dataclass(frozen=True, kw_only=True)
class ScalingFit:
    """All candidate fits and the chosen one; `usl` holds the full USL fit when it could be made."""

    chosen: str
    models: list[ModelFit]
    usl: UslFit | None
    levels: list[float]
    throughput: list[float]
    efficiency: list[float] = field(default_factory=list)
    """X(N)/(N·X(N0)/N0) per level, relative to the smallest level N0 (medians per level)."""
    karp_flatt: list[float | None] = field(default_factory=list)
    """Experimentally determined serial fraction per level (None at the baseline level)."""

    def model(self, name: str) -> ModelFit | None:
        return next((m for m in self.models if m.model == name), None)


def aic(rss: float, n: int, k: int) -> float:
    # A perfect fit has RSS 0 and AIC −∞; floor it so ties are broken by k, not by log(0).
    rss = max(rss, 1e-300)
    value = n * math.log(rss / n) + 2 * k
    if n - k - 1 > 0:
        value += 2 * k * (k + 1) / (n - k - 1)
    return value


def fit_linear(n: np.ndarray, x: np.ndarray) -> ModelFit:
    gamma = float(np.dot(n, x) / np.dot(n, n))
    fitted = gamma * n
    rss = float(np.sum((fitted - x) ** 2))
    return ModelFit(
        model="linear",
        params={"gamma": gamma},
        k=1,
        rss=rss,
        aic=aic(rss, len(n), 1),
        fitted=fitted.tolist(),
    )


def fit_amdahl(n: np.ndarray, x: np.ndarray) -> ModelFit:
    g0 = max(float(np.max(x[n == n.min()]) / n.min()), 1e-12)

    def resid(p: np.ndarray) -> np.ndarray:
        return (usl(n, p[0] * g0, p[1], 0.0) - x) / g0

    r = optimize.least_squares(
        resid,
        x0=[1.0, 0.05],
        bounds=([0.0, 0.0], [np.inf, 1.0]),
        method="trf",
        xtol=1e-14,
        ftol=1e-14,
        gtol=1e-14,
    )
    gamma, alpha = float(r.x[0] * g0), float(r.x[1])
    fitted = usl(n, gamma, alpha, 0.0)
    rss = float(np.sum((fitted - x) ** 2))
    return ModelFit(
        model="amdahl",
        params={"gamma": gamma, "alpha": alpha, "parallel_fraction": 1.0 - alpha},
        k=2,
        rss=rss,
        aic=aic(rss, len(n), 2),
        fitted=fitted.tolist(),
    )


def relative_efficiency(levels: Sequence[float], throughput: Sequence[float]) -> list[float]:
    n0, x0 = levels[0], throughput[0]
    if x0 <= 0:
        return [math.nan for _ in levels]
    return [(x / x0) / (n / n0) for n, x in zip(levels, throughput, strict=True)]


def relative_karp_flatt(levels: Sequence[float], throughput: Sequence[float]) -> list[float | None]:
    """Karp–Flatt with the smallest level as the unit: p = N/N0 workers, S = X/X0."""
    n0, x0 = levels[0], throughput[0]
    out: list[float | None] = []
    for n, x in zip(levels, throughput, strict=True):
        p = n / n0
        if p <= 1 or x <= 0 or x0 <= 0:
            out.append(None)
            continue
        s = x / x0
        out.append((1.0 / s - 1.0 / p) / (1.0 - 1.0 / p))
    return out


def fit_scaling(n: Sequence[float] | np.ndarray, x: Sequence[float] | np.ndarray) -> ScalingFit:
    """Fit linear, Amdahl and (with >= 3 levels) USL; pick by AIC. Repeats per level are allowed."""
    na, xa = check_xy(n, x, min_levels=2, what="scaling")
    models = [fit_linear(na, xa), fit_amdahl(na, xa)]
    u: UslFit | None = None
    if len(np.unique(na)) >= 3:
        u = fit_usl(na, xa)
        models.append(
            ModelFit(
                model="usl",
                params={"gamma": u.gamma.value, "alpha": u.alpha.value, "beta": u.beta.value},
                k=3,
                rss=u.rss,
                aic=aic(u.rss, len(na), 3),
                fitted=u.fitted,
            )
        )
    chosen = min(models, key=lambda m: (m.aic, m.k)).model
    levels = sorted(set(na.tolist()))
    med = [float(np.median(xa[na == lv])) for lv in levels]
    return ScalingFit(
        chosen=chosen,
        models=models,
        usl=u,
        levels=levels,
        throughput=med,
        efficiency=relative_efficiency(levels, med),
        karp_flatt=relative_karp_flatt(levels, med),
    )
