"""The Chinchilla parametric scaling law L(N, D) = E + A/N^α + B/D^β: fit and compute-optimal plan.

Fit (Hoffmann et al. 2022, Approach 3, as replicated by Besiroglu et al. 2024 / Epoch AI): with
a = log A, b = log B, e = log E, minimise the sum of Huber losses (δ = 1e-3) of
log L̂ − log L, where log L̂ = LSE(a − α log N, b − β log D, e), by L-BFGS from a grid of starting
points, keeping the best. Plan: with training compute C = 6ND, the N that minimises
L(N, C/(6N)) is N_opt = G·(C/6)^(β/(α+β)), G = (αA/(βB))^(1/(α+β)), D_opt = (C/6)/N_opt.

Python API (used by `scalelab fit/plan chinchilla` and by the trainer's `train scaling-law`):

    fit = fit_chinchilla(n, d, loss)                  # arrays of params, tokens (rows), loss
    fit.E, fit.A, fit.B, fit.alpha, fit.beta          # the law; fit.predict(n, d) evaluates it
    plan = compute_optimal(fit, 1e21)                 # or compute_optimal(EPOCH_PARAMS, 1e21)
    plan.n_opt, plan.d_opt, plan.tokens_per_param, plan.loss, plan.dloss_dcompute

`n` is model size (parameters), `d` the amount of training data (tokens for a language model;
examples or rows for anything else — the law does not care about the unit, but the planner's
C = 6ND assumes a transformer's FLOP per parameter per token), `loss` a positive loss (the log is
taken). Pass `drop_highest(...)` first to mimic Epoch, who dropped the 5 highest-loss runs.

Reading a fit on small, noisy, non-LLM data (say 9–16 runs of a small tabular model): five
parameters from a dozen points are weakly identified. The optimiser works in bounded, centred
coordinates (log N and log D minus their means; exponents in [0, 5]), so it never returns NaN or
overflows, but it may return a degenerate law:
- `at_bounds` names parameters that ended on a bound: an exponent at 0 means that axis did not
  change the loss over the range measured (its term merges into E); at 5 it means the loss fell off
  a cliff (too few levels to tell); E at its lower bound means no floor was visible.
- `starts_at_best` / `starts` says how many starting points reached the best objective; few means
  a rugged surface and a fit to treat with suspicion.
- `rms_log_residual` is the typical relative misfit (0.01 ≈ 1%): compare it with the run-to-run
  noise of your loss before trusting extrapolations.
- `standard_errors` (when `bootstrap` > 0) come from refitting resamples of the points; an SE as
  large as the estimate means that parameter is not determined by the data.
- With δ = 1e-3 and residuals of several percent, the Huber loss is in effect least absolute
  deviations (robust to outliers, slower to converge); pass `huber_delta=0.1` or more to get
  least squares on log loss instead.
Interpolating inside the measured range is safe even when the parameters are not individually
determined; extrapolating N or D past it, and the compute-optimal plan, are not.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import overload

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize, minimize_scalar

from scalelab.lab.core.errors import BadInputError

PARAM_NAMES = ("E", "A", "B", "alpha", "beta")
MIN_POINTS = 6
"""Five parameters need at least six points to leave a residual."""

_EXP_BOUND = 5.0
# Centred log-terms may sit this far below the smallest loss (a share of e^-30 ≈ 1e-13 of it, i.e.
# the term vanishes) or above the largest; beyond that the fit is meaningless but stays finite.
_LOG_BELOW = 30.0
_LOG_ABOVE = 5.0


@dataclass(frozen=True, kw_only=True)
class ChinchillaParams:
    """The five parameters of L(N, D) = E + A/N^alpha + B/D^beta."""

    E: float
    """Irreducible loss (the entropy of the data, in the loss's units)."""
    A: float
    """Scale of the model-size term."""
    B: float
    """Scale of the data term."""
    alpha: float
    """Exponent of model size N."""
    beta: float
    """Exponent of data D."""

    def __post_init__(self) -> None:
        for name in PARAM_NAMES:
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise BadInputError(
                    f"Chinchilla parameter {name} must be a finite number >= 0 (got {v!r}); "
                    "give E,A,B,alpha,beta like 1.8169,482.01,2085.43,0.34781,0.36585"
                )

    @overload
    def predict(self, n: float, d: float) -> float: ...
    @overload
    def predict(self, n: ArrayLike, d: ArrayLike) -> NDArray[np.float64]: ...
    def predict(self, n: ArrayLike, d: ArrayLike) -> float | NDArray[np.float64]:
        """The law's loss at model size n and data d (scalars or arrays, broadcast)."""
        nn = np.asarray(n, dtype=float)
        dd = np.asarray(d, dtype=float)
        out = self.E + self.A * nn ** -self.alpha + self.B * dd ** -self.beta
        return float(out) if out.ndim == 0 else out

    @property
    def params(self) -> ChinchillaParams:
        return ChinchillaParams(E=self.E, A=self.A, B=self.B, alpha=self.alpha, beta=self.beta)


EPOCH_PARAMS = ChinchillaParams(E=1.8169, A=482.01, B=2085.43, alpha=0.34781, beta=0.36585)
"""Besiroglu et al. 2024 (Epoch AI), refit on 240 points read off Hoffmann et al.'s Figure 4."""
HOFFMANN_PARAMS = ChinchillaParams(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
"""Hoffmann et al. 2022, as published (Approach 3)."""


@dataclass(frozen=True, kw_only=True)
class StartGrid:
    """Data-scaled starting points: every combination of exponents and shares of the loss.

    A start gives the three terms E, A/N^alpha and B/D^beta the chosen shares of the median loss at
    the centre of the data (geometric mean N and D), so it means the same for any loss scale or
    unit; `points` values per axis give points^5 starts (fewer after merging equal shares).
    """

    points: int = 3
    """Values per axis: 3 -> 195 starts (a few seconds on 240 points); 4 -> 880."""
    exponent_range: tuple[float, float] = (0.1, 1.0)
    """Smallest and largest starting alpha and beta (spaced geometrically)."""
    share_range: tuple[float, float] = (0.05, 0.8)
    """Smallest and largest starting share of each term (spaced geometrically, then normalised)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.points, int) and 1 <= self.points <= 10):
            raise BadInputError(
                f"grid points per axis must be an integer 1..10 (got {self.points})")
        for name, (lo, hi) in (("exponent_range", self.exponent_range),
                               ("share_range", self.share_range)):
            if not (0 < lo <= hi) or not math.isfinite(hi):
                raise BadInputError(f"{name} must be 0 < low <= high (got {(lo, hi)})")


EPOCH_GRID = "epoch"
"""Epoch's grid in (a, b, e, alpha, beta): 6 x 6 x 5 x 5 x 5 = 4500 fixed starts (~1 min)."""


def _epoch_starts() -> NDArray[np.float64]:
    ab = np.arange(0.0, 30.0, 5.0)
    e = np.arange(-1.0, 1.5, 0.5)
    ex = np.arange(0.0, 2.5, 0.5)
    return np.array(list(itertools.product(ab, ab, e, ex, ex)), dtype=float)


@dataclass(frozen=True, kw_only=True)
class ChinchillaFit(ChinchillaParams):
    """A fitted law plus how well and how firmly the data determine it (see module docstring)."""

    loss: float
    """The minimised objective: sum over points of Huber(log L̂ - log L)."""
    n_points: int
    """Points fitted."""
    huber_delta: float
    """Huber threshold on log-loss residuals."""
    rms_log_residual: float
    """Root mean square of log L̂ - log L (≈ relative error of the fitted loss)."""
    starts: int
    """Starting points tried."""
    starts_at_best: int
    """Starts whose optimum reached the best objective (within 1e-4 relative)."""
    at_bounds: tuple[str, ...] = ()
    """Parameters that ended on a bound of the search (a degenerate fit; see module docstring)."""
    warnings: tuple[str, ...] = ()
    """Plain-language cautions: bounds hit, vanished terms, few starts agreeing, loose SEs."""
    bootstrap: int = 0
    """Bootstrap resamples behind `standard_errors` (0: none computed)."""
    standard_errors: dict[str, float] | None = None
    """Bootstrap standard deviation of each parameter, or None."""
    data_range: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Min and max of n, d and loss in the data: the region where predictions are interpolation."""


def drop_highest(n: ArrayLike, d: ArrayLike, loss: ArrayLike, k: int
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Drop the k highest-loss points as Epoch did (keep loss < the k-th highest; ties go too)."""
    nn, dd, ll = (np.asarray(x, dtype=float) for x in (n, d, loss))
    if k < 0:
        raise BadInputError(f"drop-highest must be >= 0 (got {k})")
    if k == 0:
        return nn, dd, ll
    if k >= ll.size:
        raise BadInputError(f"cannot drop the {k} highest-loss points of only {ll.size}")
    keep = ll < np.sort(ll)[-k]
    return nn[keep], dd[keep], ll[keep]


class _Objective:
    """Huber loss of log residuals and its gradient in centred coordinates.

    Centring (a' = a - alpha·mean log N) decouples the scale from the exponent: the same minimum,
    reached from more starts (on Epoch's data, from 7% to 15% of Epoch's grid; 69% of the
    default data-scaled grid).
    """

    def __init__(self, log_n: NDArray[np.float64], log_d: NDArray[np.float64],
                 log_l: NDArray[np.float64], delta: float) -> None:
        self.mn, self.md = float(log_n.mean()), float(log_d.mean())
        self.cn, self.cd = log_n - self.mn, log_d - self.md
        self.log_l, self.delta = log_l, delta
        lo, hi = float(log_l.min()) - _LOG_BELOW, float(log_l.max()) + _LOG_ABOVE
        self.bounds = [(lo, hi), (lo, hi), (lo, hi), (0.0, _EXP_BOUND), (0.0, _EXP_BOUND)]

    def log_pred(self, p: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        t = np.stack([p[0] - p[3] * self.cn, p[1] - p[4] * self.cd, np.full_like(self.cn, p[2])])
        top = t.max(axis=0)
        w = np.exp(t - top)
        s = w.sum(axis=0)
        return top + np.log(s), w / s

    def __call__(self, p: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        pred, w = self.log_pred(p)
        r = pred - self.log_l
        small = np.abs(r) <= self.delta
        f = np.where(small, 0.5 * r * r, self.delta * (np.abs(r) - 0.5 * self.delta)).sum()
        g = np.where(small, r, self.delta * np.sign(r))
        gw = g * w
        grad = np.array([gw[0].sum(), gw[1].sum(), gw[2].sum(),
                         -(gw[0] * self.cn).sum(), -(gw[1] * self.cd).sum()])
        return float(f), grad

    def to_centred(self, abe: NDArray[np.float64]) -> NDArray[np.float64]:
        """(a, b, e, alpha, beta) -> centred coordinates, clipped into the bounds."""
        c = abe.astype(float).copy()
        c[..., 0] -= c[..., 3] * self.mn
        c[..., 1] -= c[..., 4] * self.md
        lo = np.array([b[0] for b in self.bounds])
        hi = np.array([b[1] for b in self.bounds])
        return np.clip(c, lo, hi)

    def to_params(self, c: NDArray[np.float64]) -> ChinchillaParams:
        return ChinchillaParams(E=math.exp(c[2]), A=math.exp(c[0] + c[3] * self.mn),
                                B=math.exp(c[1] + c[4] * self.md), alpha=float(c[3]),
                                beta=float(c[4]))

    def minimise(self, x0: NDArray[np.float64], *, tight: bool = False) -> tuple[
            NDArray[np.float64], float]:
        opts = ({"ftol": 1e-15, "gtol": 1e-12, "maxiter": 20000} if tight else
                {"maxiter": 2000})
        r = minimize(self, x0, jac=True, method="L-BFGS-B", bounds=self.bounds, options=opts)
        return np.asarray(r.x, dtype=float), float(r.fun)


def _scaled_starts(grid: StartGrid, obj: _Objective) -> NDArray[np.float64]:
    k = grid.points
    ex = np.geomspace(*grid.exponent_range, k)
    sh = np.geomspace(*grid.share_range, k)
    med = float(np.median(obj.log_l))
    rows = set()
    for fe, fa, fb in itertools.product(sh, sh, sh):
        tot = fe + fa + fb
        terms = (med + math.log(fa / tot), med + math.log(fb / tot), med + math.log(fe / tot))
        for al, be in itertools.product(ex, ex):
            rows.add(tuple(round(v, 12) for v in (*terms, al, be)))
    return np.clip(np.array(sorted(rows)), [b[0] for b in obj.bounds], [b[1] for b in obj.bounds])


def _check_data(n: ArrayLike, d: ArrayLike, loss: ArrayLike) -> tuple[
        NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    arrays = []
    for name, x in (("n (model size)", n), ("d (data/tokens)", d), ("loss", loss)):
        a = np.asarray(x, dtype=float).ravel()
        bad = ~np.isfinite(a) | (a <= 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise BadInputError(f"{name}: point {i} is {a[i]!r}; every value must be a finite "
                                "number > 0 (the fit works on logarithms)")
        arrays.append(a)
    if not arrays[0].size == arrays[1].size == arrays[2].size:
        raise BadInputError(f"n, d and loss differ in length ({[a.size for a in arrays]})")
    if arrays[0].size < MIN_POINTS:
        raise BadInputError(f"the Chinchilla law has 5 parameters: give at least {MIN_POINTS} "
                            f"points (got {arrays[0].size})")
    return arrays[0], arrays[1], arrays[2]


def fit_chinchilla(n: ArrayLike, d: ArrayLike, loss: ArrayLike, *, huber_delta: float = 1e-3,
                   grid: StartGrid | str = StartGrid(), bootstrap: int = 0,
                   seed: int = 0) -> ChinchillaFit:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. Approach 3; see module docstring).

    `grid` is a StartGrid (data-scaled starts, default 3 values per axis) or "epoch" (Epoch's
    4500 fixed starts). The best start is polished with tight tolerances, so the answer does not
    depend on which start reached the basin first. `bootstrap` > 0 refits that many resamples
    (with replacement, seeded) from the best fit to give standard errors.
    """
    nn, dd, ll = _check_data(n, d, loss)
    if not (math.isfinite(huber_delta) and huber_delta > 0):
        raise BadInputError(f"huber_delta must be > 0 (got {huber_delta})")
    if bootstrap < 0:
        raise BadInputError(f"bootstrap must be >= 0 (got {bootstrap})")
    obj = _Objective(np.log(nn), np.log(dd), np.log(ll), huber_delta)
    if isinstance(grid, StartGrid):
        starts = _scaled_starts(grid, obj)
    elif grid == EPOCH_GRID:
        starts = obj.to_centred(_epoch_starts())
    else:
        raise BadInputError(f"grid must be a StartGrid or {EPOCH_GRID!r} (got {grid!r})")

    with _one_thread():
        results = [obj.minimise(x0) for x0 in starts]
        best_x, best_f = min(results, key=lambda r: r[1])
        at_best = sum(f <= best_f * (1 + 1e-4) + 1e-12 for _, f in results)
        polished, polished_f = obj.minimise(best_x, tight=True)
        if polished_f <= best_f:
            best_x, best_f = polished, polished_f
        ses = _bootstrap(nn, dd, ll, huber_delta, best_x, bootstrap, seed) if bootstrap else None

    p = obj.to_params(best_x)
    pred, _ = obj.log_pred(best_x)
    lo_b = [b[0] for b in obj.bounds]
    hi_b = [b[1] for b in obj.bounds]
    names = ("A", "B", "E", "alpha", "beta")
    at_bounds = tuple(nm for nm, v, lo, hi in zip(names, best_x, lo_b, hi_b, strict=True)
                      if abs(v - lo) < 1e-6 or abs(v - hi) < 1e-6)
    _, shares = obj.log_pred(best_x)
    warn = _warnings(p, at_bounds, shares.max(axis=1), int(at_best), len(starts), ses)
    for axis, values, pair in (("model size", nn, "A/N^alpha"), ("data size", dd, "B/D^beta")):
        if np.unique(values).size < 2:
            warn += (f"every run has the same {axis}: {pair} is one number here, so its scale "
                     "and exponent are not separately determined",)
    return ChinchillaFit(
        **{f.name: getattr(p, f.name) for f in fields(ChinchillaParams)},
        loss=best_f, n_points=int(ll.size), huber_delta=huber_delta,
        rms_log_residual=float(np.sqrt(np.mean((pred - obj.log_l) ** 2))),
        starts=len(starts), starts_at_best=int(at_best), at_bounds=at_bounds, warnings=warn,
        bootstrap=bootstrap, standard_errors=ses,
        data_range={k: (float(v.min()), float(v.max()))
                    for k, v in (("n", nn), ("d", dd), ("loss", ll))},
    )


def _one_thread() -> contextlib.AbstractContextManager[object]:
    # Thousands of tiny L-BFGS-B solves: a multi-threaded BLAS spins its threads on every call,
    # measured 45x slower (18 s vs 0.4 s) on a loaded 2-core machine. threadpoolctl is optional.
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


_TERM_NOTES = (
    "A/N^alpha is negligible at every point: loss did not depend on model size in this range",
    "B/D^beta is negligible at every point: loss did not depend on data in this range",
    "E is negligible at every point: no loss floor is visible in this range",
)


def _warnings(p: ChinchillaParams, at_bounds: tuple[str, ...], max_share: NDArray[np.float64],
              at_best: int, starts: int, ses: dict[str, float] | None) -> tuple[str, ...]:
    out = []
    axis = {"alpha": "model size N", "beta": "data D"}
    for nm in at_bounds:
        v = getattr(p, nm)
        if nm in axis and v == 0:
            out.append(f"{nm} = 0 (on its bound): loss does not change with {axis[nm]} over the "
                       "range measured; that term merges into E")
        else:
            out.append(f"{nm} = {v:.4g} is on a bound of the search: the data do not pin it down")
    out.extend(note for note, s in zip(_TERM_NOTES, max_share, strict=True) if s < 1e-4)
    if at_best < max(2, 0.05 * starts):
        out.append(f"only {at_best} of {starts} starts reached the best fit: a rugged surface; "
                   "try a bigger grid")
    if ses:
        loose = [nm for nm in PARAM_NAMES if ses[nm] >= abs(getattr(p, nm)) > 0]
        if loose:
            out.append(f"bootstrap SE >= estimate for {', '.join(loose)}: not determined by the "
                       "data (interpolate, do not extrapolate)")
    return tuple(out)


def objective(p: ChinchillaParams, n: ArrayLike, d: ArrayLike, loss: ArrayLike, *,
              huber_delta: float = 1e-3) -> float:
    """The fit's objective at given parameters: sum of Huber(log L̂ - log L) (lower is better)."""
    nn, dd, ll = _check_data(n, d, loss)
    r = np.log(p.predict(nn, dd)) - np.log(ll)
    small = np.abs(r) <= huber_delta
    return float(np.where(small, 0.5 * r * r, huber_delta * (np.abs(r) - 0.5 * huber_delta)).sum())


def _bootstrap(nn: NDArray[np.float64], dd: NDArray[np.float64], ll: NDArray[np.float64],
               delta: float, best_x: NDArray[np.float64], reps: int, seed: int) -> dict[str, float]:
    # Each resample starts from the full-data optimum, as Epoch's bootstrap did (from one start,
    # not the grid): ~reps × 20 ms instead of reps × the whole grid.
    rng = np.random.default_rng(seed)
    full = _Objective(np.log(nn), np.log(dd), np.log(ll), delta)
    draws = []
    for _ in range(reps):
        idx = rng.integers(0, ll.size, ll.size)
        o = _Objective(np.log(nn[idx]), np.log(dd[idx]), np.log(ll[idx]), delta)
        # Re-centre the start for this resample's means; same law, other coordinates.
        x0 = o.to_centred(_uncentre(full, best_x))
        x, _ = o.minimise(x0)
        p = o.to_params(x)
        draws.append([getattr(p, nm) for nm in PARAM_NAMES])
    sd = np.std(np.array(draws), axis=0, ddof=1) if reps > 1 else np.zeros(5)
    return {nm: float(s) for nm, s in zip(PARAM_NAMES, sd, strict=True)}


def _uncentre(obj: _Objective, c: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.array([c[0] + c[3] * obj.mn, c[1] + c[4] * obj.md, c[2], c[3], c[4]])


@dataclass(frozen=True, kw_only=True)
class ComputeOptimal:
    """The compute-optimal allocation of a budget C = 6·N·D under a Chinchilla law."""

    compute: float
    """Training compute C in FLOP."""
    n_opt: float
    """Compute-optimal model size (parameters), closed form."""
    d_opt: float
    """Compute-optimal data (tokens) = C / (6 n_opt)."""
    tokens_per_param: float
    """d_opt / n_opt."""
    loss: float
    """Predicted loss L(n_opt, d_opt)."""
    dloss_dcompute: float
    """dL*/dC: loss change per extra FLOP along the optimal path (negative) = -γ(L*-E)/C."""
    dloss_per_doubling: float
    """L*(2C) - L*(C): loss change from doubling the compute (negative) = (L*-E)(2^-γ - 1)."""
    n_exponent: float
    """a = beta/(alpha+beta): N_opt grows as C^a."""
    d_exponent: float
    """b = alpha/(alpha+beta): D_opt grows as C^b."""
    loss_exponent: float
    """γ = alpha·beta/(alpha+beta): L* - E falls as C^-γ."""
    n_opt_numeric: float
    """The same optimum found numerically (a check on the closed form)."""
    params: ChinchillaParams
    """The law planned with."""


def compute_optimal(fit_or_params: ChinchillaParams, compute: float) -> ComputeOptimal:
    """Split compute C = 6ND between model size and data to minimise the law's loss."""
    p = fit_or_params.params
    if not (isinstance(compute, int | float) and math.isfinite(compute) and compute > 0):
        raise BadInputError(f"compute must be a finite number of FLOP > 0 (got {compute!r}); "
                            "e.g. 1e21")
    if p.alpha <= 0 or p.beta <= 0 or p.A <= 0 or p.B <= 0:
        raise BadInputError(
            "this law has no compute-optimal split: it needs A, B, alpha, beta > 0 (got "
            f"A={p.A:g}, B={p.B:g}, alpha={p.alpha:g}, beta={p.beta:g}); an exponent of 0 means "
            "loss does not depend on that axis in the data fitted")
    s = p.alpha + p.beta
    c6 = compute / 6.0
    # Logs keep G·(C/6)^a finite for extreme exponents and budgets.
    log_g = (math.log(p.alpha * p.A) - math.log(p.beta * p.B)) / s
    n_opt = math.exp(log_g + (p.beta / s) * math.log(c6))
    d_opt = c6 / n_opt
    loss = p.predict(n_opt, d_opt)
    gamma = p.alpha * p.beta / s
    excess = loss - p.E
    numeric = minimize_scalar(lambda x: p.predict(math.exp(x), c6 / math.exp(x)),
                              bracket=(math.log(n_opt) - 1.0, math.log(n_opt) + 1.0),
                              method="brent", tol=1e-12)
    return ComputeOptimal(
        compute=float(compute), n_opt=n_opt, d_opt=d_opt, tokens_per_param=d_opt / n_opt,
        loss=loss, dloss_dcompute=-gamma * excess / compute,
        dloss_per_doubling=excess * (2.0 ** -gamma - 1.0),
        n_exponent=p.beta / s, d_exponent=p.alpha / s, loss_exponent=gamma,
        n_opt_numeric=math.exp(float(numeric.x)), params=p,
    )


@dataclass(frozen=True, kw_only=True)
class ModelSizeCheck:
    """How a chosen model size compares with the compute-optimal one at the same budget."""

    n: float
    """The model size evaluated."""
    d: float
    """Data it can train on within the budget: C / (6n)."""
    tokens_per_param: float
    """d / n."""
    loss: float
    """Predicted loss L(n, d)."""
    excess_loss: float
    """loss - the compute-optimal loss (>= 0)."""
    compute_for_same_loss: float
    """Compute the optimal allocation needs to reach this loss (inf when loss <= E)."""
    compute_efficiency: float
    """compute_for_same_loss / compute: the share of the budget this model size puts to use."""


def evaluate_model_size(p: ChinchillaParams, compute: float, n: float) -> ModelSizeCheck:
    """Loss of model size n trained on the budget's data, and its gap to the optimum."""
    if not (math.isfinite(n) and n > 0):
        raise BadInputError(f"model size must be a number of parameters > 0 (got {n!r})")
    opt = compute_optimal(p, compute)
    d = compute / (6.0 * n)
    loss = p.predict(n, d)
    # Along the optimal path L* - E = (opt.loss - E)·(C'/C)^-γ; invert for the C' giving `loss`.
    excess_here = loss - p.params.E
    same = (compute * ((opt.loss - p.params.E) / excess_here) ** (1.0 / opt.loss_exponent)
            if excess_here > 0 else math.inf)
    return ModelSizeCheck(n=float(n), d=d, tokens_per_param=d / n, loss=loss,
                          excess_loss=loss - opt.loss, compute_for_same_loss=same,
                          compute_efficiency=same / compute)


def params_from_values(values: Sequence[float]) -> ChinchillaParams:
    """E, A, B, alpha, beta in that order (the CLI's --params)."""
    if len(values) != 5:
        raise BadInputError(f"--params needs 5 numbers E,A,B,alpha,beta (got {len(values)})")
    return ChinchillaParams(**dict(zip(PARAM_NAMES, (float(v) for v in values), strict=True)))
