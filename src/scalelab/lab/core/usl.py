"""Fitting the Universal Scalability Law X(N) = γN / (1 + α(N−1) + βN(N−1)).

α is contention (the serial fraction, as in Amdahl), β is coherency (pairwise crosstalk that makes
throughput fall past a peak), γ the throughput of one unit. The fit is bounded nonlinear least
squares (α, β in [0, 1], γ >= 0) with standard errors from the Jacobian at the optimum.

The standard errors assume errors of constant variance; when noise is proportional to
throughput (common), they are too narrow for β — treat the interval as a lower bound on the
uncertainty and repeat the measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from scalelab.lab.core.errors import BadInputError


@dataclass(frozen=True, kw_only=True)
class Param:
    """A fitted parameter with its standard error and confidence interval (None when undefined:
    no residual degrees of freedom, or the parameter sits on a bound)."""

    value: float
    stderr: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True, kw_only=True)
class UslFit:
    alpha: Param
    beta: Param
    gamma: Param
    rse: float | None
    """Residual standard error sqrt(RSS / (n − 3)); None with 3 points or fewer."""
    rss: float
    n_points: int
    confidence: float
    n_peak: float
    """Concurrency of maximum throughput, sqrt((1 − α) / β); infinite when β == 0."""
    n_opt: float
    """1/α: the load at which contention alone halves efficiency; infinite when α == 0."""
    x_limit: float
    """γ/α: the throughput ceiling contention alone imposes; infinite when α == 0."""
    x_peak: float
    """Predicted throughput at n_peak (the ceiling X_limit when β == 0)."""
    fitted: list[float]
    """Fitted throughput at each input N, in input order."""

    def predict(self, n: float) -> float:
        return usl(
            np.asarray([n], dtype=float), self.gamma.value, self.alpha.value, self.beta.value
        )[0].item()


def usl(n: np.ndarray, gamma: float, alpha: float, beta: float) -> np.ndarray:
    return gamma * n / (1.0 + alpha * (n - 1.0) + beta * n * (n - 1.0))


def check_xy(
    n: Sequence[float] | np.ndarray,
    x: Sequence[float] | np.ndarray,
    *,
    min_levels: int,
    what: str = "USL",
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (resource, throughput) series: same length, finite, N >= 1, X >= 0."""
    na = np.asarray(n, dtype=float)
    xa = np.asarray(x, dtype=float)
    if na.shape != xa.shape or na.ndim != 1:
        raise BadInputError(f"{what} fit needs as many throughput values as resource levels")
    if not (np.all(np.isfinite(na)) and np.all(np.isfinite(xa))):
        raise BadInputError(f"{what} fit: resource levels and throughputs must be finite numbers")
    if np.any(na < 1):
        raise BadInputError(f"{what} fit: resource levels must be >= 1 (got {na.min():g})")
    if np.any(xa < 0):
        raise BadInputError(f"{what} fit: throughput must be >= 0 (got {xa.min():g})")
    if len(np.unique(na)) < min_levels:
        raise BadInputError(
            f"{what} fit needs at least {min_levels} distinct resource levels "
            f"(got {len(np.unique(na))}); measure more levels, e.g. 1,2,5,10"
        )
    return na, xa


def _param(value: float, se: float | None, tq: float | None, lo: float, hi: float) -> Param:
    on_bound = math.isclose(value, lo, abs_tol=1e-12) or math.isclose(value, hi, abs_tol=1e-12)
    if se is None or tq is None or not math.isfinite(se) or on_bound:
        return Param(
            value=value,
            stderr=None if se is None or not math.isfinite(se) else se,
            ci_low=None,
            ci_high=None,
        )
    return Param(
        value=value, stderr=se, ci_low=max(lo, value - tq * se), ci_high=min(hi, value + tq * se)
    )


def _jacobian(n: np.ndarray, gamma: float, alpha: float, beta: float) -> np.ndarray:
    """dX/d(γ, α, β) at every N, in original units (for the covariance of the estimates)."""
    d = 1.0 + alpha * (n - 1.0) + beta * n * (n - 1.0)
    return np.column_stack(
        [n / d, -gamma * n * (n - 1.0) / d**2, -gamma * n * n * (n - 1.0) / d**2]
    )


def _refit_pinned(
    resid: Callable[[np.ndarray], np.ndarray], g: float, alpha: float, beta: float, *,
    pin_a: bool, pin_b: bool,
) -> tuple[float, float, float, float] | None:
    """The least-squares fit with α and/or β held at the given values: (g, α, β, cost)."""
    free = [0] + ([] if pin_a else [1]) + ([] if pin_b else [2])
    start = np.array([g, alpha, beta])

    def full(q: np.ndarray) -> np.ndarray:
        p = start.copy()
        p[free] = q
        return p

    lo = np.zeros(len(free))
    hi = np.array([np.inf, 1.0, 1.0])[free]
    r = optimize.least_squares(
        lambda q: resid(full(q)), x0=np.clip(start[free], lo, hi), bounds=(lo, hi),
        method="trf", x_scale="jac", xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=5000,
    )
    if not r.success and r.status <= 0:
        return None
    p = full(r.x)
    return float(p[0]), float(p[1]), float(p[2]), float(r.cost)


def fit_usl(
    n: Sequence[float] | np.ndarray, x: Sequence[float] | np.ndarray, *, confidence: float = 0.95
) -> UslFit:
    """Fit the USL to measured (N, X) points; repeats at the same N are allowed and used."""
    na, xa = check_xy(n, x, min_levels=3)
    if np.all(xa == 0):
        raise BadInputError("USL fit: every throughput is 0; nothing to fit")
    # γ is the throughput of one unit: start from the best per-unit rate seen at the smallest N.
    g0 = float(np.max(xa[na == na.min()]) / na.min())
    scale = max(g0, 1e-12)

    def resid(p: np.ndarray) -> np.ndarray:
        return (usl(na, p[0] * scale, p[1], p[2]) - xa) / scale

    best: optimize.OptimizeResult | None = None
    for a0 in (0.0, 0.05, 0.3):
        for b0 in (0.0, 1e-4, 1e-2):
            r = optimize.least_squares(
                resid,
                x0=[1.0, a0, b0],
                bounds=([0.0, 0.0, 0.0], [np.inf, 1.0, 1.0]),
                method="trf",
                x_scale="jac",
                xtol=1e-14,
                ftol=1e-14,
                gtol=1e-14,
                max_nfev=5000,
            )
            if best is None or r.cost < best.cost:
                best = r
    assert best is not None
    g, alpha, beta = (float(v) for v in best.x)
    # The optimiser approaches a bound asymptotically, so a penalty that the data do not support
    # ends a hair above zero (how far depends on the scipy release). Pin it at its bound when the
    # fit with it pinned is as good to float precision: the simpler model, exactly.
    for pin_a, pin_b in ((True, True), (False, True), (True, False)):
        if (not pin_a or alpha == 0.0) and (not pin_b or beta == 0.0):
            continue  # pinning would change nothing
        pinned = _refit_pinned(resid, g, 0.0 if pin_a else alpha, 0.0 if pin_b else beta,
                               pin_a=pin_a, pin_b=pin_b)
        if pinned is not None and pinned[3] <= best.cost * (1 + 1e-9) + 1e-24:
            g, alpha, beta = pinned[0], pinned[1], pinned[2]
            break
    # Below these, α and β change X(N) by less than 1e-4 relative at any N up to 10^4.
    alpha = 0.0 if alpha < 1e-9 else alpha
    beta = 0.0 if beta < 1e-12 else beta
    gamma = g * scale
    fitted = usl(na, gamma, alpha, beta)
    rss = float(np.sum((fitted - xa) ** 2))
    dof = len(na) - 3
    se: list[float | None] = [None, None, None]
    tq: float | None = None
    rse: float | None = None
    if dof > 0:
        rse = math.sqrt(rss / dof)
        tq = float(stats.t.ppf(0.5 + confidence / 2, dof))
        # Covariance s²(JᵀJ)⁻¹ with J in original units (rescale the γ column back).
        jac = _jacobian(na, gamma, alpha, beta)
        try:
            cov = np.linalg.inv(jac.T @ jac) * (rss / dof)
            se = [math.sqrt(v) if v >= 0 else None for v in np.diag(cov)]
        except np.linalg.LinAlgError:
            se = [None, None, None]
    n_peak = math.inf if beta <= 0 else math.sqrt(max(0.0, 1.0 - alpha) / beta)
    x_limit = math.inf if alpha <= 0 else gamma / alpha
    x_peak = x_limit if beta <= 0 else float(usl(np.asarray([n_peak]), gamma, alpha, beta)[0])
    return UslFit(
        gamma=_param(gamma, se[0], tq, 0.0, math.inf),
        alpha=_param(alpha, se[1], tq, 0.0, 1.0),
        beta=_param(beta, se[2], tq, 0.0, 1.0),
        rse=rse,
        rss=rss,
        n_points=len(na),
        confidence=confidence,
        n_peak=n_peak,
        n_opt=math.inf if alpha <= 0 else 1.0 / alpha,
        x_limit=x_limit,
        x_peak=x_peak,
        fitted=[float(v) for v in fitted],
    )
