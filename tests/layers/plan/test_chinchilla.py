import csv
import math
from pathlib import Path

import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.plan.chinchilla import (
    EPOCH_GRID,
    EPOCH_PARAMS,
    ChinchillaFit,
    ChinchillaParams,
    StartGrid,
    compute_optimal,
    drop_highest,
    evaluate_model_size,
    fit_chinchilla,
    objective,
    params_from_values,
)

EPOCH_CSV = Path(__file__).parent / "data" / "chinchilla_epoch.csv"
FAST = StartGrid(points=2)  # 28 starts: reaches the same optimum as Epoch's 4500 on this data


def _epoch_points() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with EPOCH_CSV.open() as fh:
        rows = list(csv.DictReader(fh))
    n = np.array([float(r["Model Size"]) for r in rows])
    c = np.array([float(r["Training FLOP"]) for r in rows])
    loss = np.array([float(r["loss"]) for r in rows])
    return n, c / (6 * n), loss


@pytest.fixture(scope="module")
def epoch_fit() -> ChinchillaFit:
    return fit_chinchilla(*drop_highest(*_epoch_points(), 5), grid=FAST)


def test_epoch_drops_five_highest_losses_leaving_240() -> None:
    n, d, loss = _epoch_points()
    assert loss.size == 245
    *_, l2 = drop_highest(n, d, loss, 5)
    assert l2.size == 240
    assert l2.max() < np.sort(loss)[-5]


def test_reproduces_epoch_estimates_within_stated_tolerance(epoch_fit: ChinchillaFit) -> None:
    # Stated tolerance: alpha, beta ±0.005 absolute; E ±0.01; A, B ±5% relative.
    f = epoch_fit
    assert f.n_points == 240
    assert f.alpha == pytest.approx(EPOCH_PARAMS.alpha, abs=0.005)
    assert f.beta == pytest.approx(EPOCH_PARAMS.beta, abs=0.005)
    assert abs(f.E - EPOCH_PARAMS.E) <= 0.01
    assert abs(f.A / EPOCH_PARAMS.A - 1) <= 0.05
    assert abs(f.B / EPOCH_PARAMS.B - 1) <= 0.05
    assert f.at_bounds == () and f.warnings == ()


def test_fit_is_a_lower_objective_than_epochs_published_point(epoch_fit: ChinchillaFit) -> None:
    # Epoch's numbers sit 0.05% above the minimum of the same objective: the small gaps in A and B
    # are their optimiser stopping early on a flat valley, not a different method.
    pts = drop_highest(*_epoch_points(), 5)
    ours = objective(epoch_fit.params, *pts)
    theirs = objective(EPOCH_PARAMS, *pts)
    assert ours == pytest.approx(epoch_fit.loss, rel=1e-9)
    assert ours < theirs < ours * 1.001


@pytest.mark.slow
def test_epochs_own_grid_reaches_the_same_optimum(epoch_fit: ChinchillaFit) -> None:
    f = fit_chinchilla(*drop_highest(*_epoch_points(), 5), grid=EPOCH_GRID)
    assert f.starts == 4500
    assert (f.E, f.A, f.B, f.alpha, f.beta) == pytest.approx(
        (epoch_fit.E, epoch_fit.A, epoch_fit.B, epoch_fit.alpha, epoch_fit.beta), rel=1e-4)


def test_bootstrap_gives_finite_seeded_standard_errors() -> None:
    pts = drop_highest(*_epoch_points(), 5)
    f1 = fit_chinchilla(*pts, grid=StartGrid(points=1), bootstrap=20, seed=3)
    f2 = fit_chinchilla(*pts, grid=StartGrid(points=1), bootstrap=20, seed=3)
    assert f1.standard_errors == f2.standard_errors
    se = f1.standard_errors
    assert se is not None
    assert all(math.isfinite(v) and v > 0 for v in se.values())
    # Same order as Epoch's bootstrap (alpha, beta SE about 0.02): not a tight check, 20 draws.
    assert 0.003 < se["alpha"] < 0.06 and 0.003 < se["beta"] < 0.06


def _grid_points(n_levels: int) -> tuple[np.ndarray, np.ndarray]:
    n, d = np.meshgrid(np.geomspace(1e7, 1e10, n_levels), np.geomspace(1e9, 1e12, n_levels))
    return n.ravel(), d.ravel()


def test_recovers_known_parameters_from_noiseless_data() -> None:
    truth = ChinchillaParams(E=1.7, A=400.0, B=410.0, alpha=0.34, beta=0.28)
    n, d = _grid_points(6)
    f = fit_chinchilla(n, d, truth.predict(n, d), grid=FAST)
    got = (f.E, f.A, f.B, f.alpha, f.beta)
    assert got == pytest.approx((1.7, 400.0, 410.0, 0.34, 0.28), rel=1e-4)
    assert f.rms_log_residual < 1e-7


def test_recovers_parameters_through_small_noise() -> None:
    truth = ChinchillaParams(E=2.0, A=500.0, B=2000.0, alpha=0.35, beta=0.37)
    n, d = _grid_points(7)
    rng = np.random.default_rng(7)
    loss = truth.predict(n, d) * np.exp(rng.normal(0, 0.002, n.size))
    f = fit_chinchilla(n, d, loss, grid=FAST)
    assert f.alpha == pytest.approx(0.35, abs=0.02)
    assert f.beta == pytest.approx(0.37, abs=0.02)
    assert abs(f.E - 2.0) <= 0.03
    # Predictions inside the data are tighter than any single parameter.
    assert np.max(np.abs(f.predict(n, d) / truth.predict(n, d) - 1)) < 0.003


def test_small_noisy_tabular_sized_data_stays_finite() -> None:
    # 12 runs of a small model: params 1e3..1e5, 1e3..2e5 rows, losses ~0.4, 5% noise.
    truth = ChinchillaParams(E=0.35, A=8.0, B=30.0, alpha=0.4, beta=0.5)
    n = np.repeat([1e3, 5e3, 2e4, 1e5], 3)
    d = np.tile([1e3, 1e4, 2e5], 4)
    loss = truth.predict(n, d) * np.exp(np.random.default_rng(1).normal(0, 0.05, n.size))
    f = fit_chinchilla(n, d, loss, grid=FAST, bootstrap=5)
    vals = [f.E, f.A, f.B, f.alpha, f.beta, f.loss, f.rms_log_residual]
    assert all(math.isfinite(v) for v in vals)
    assert f.standard_errors is not None
    assert all(math.isfinite(v) for v in f.standard_errors.values())
    assert 0 <= f.alpha <= 5 and 0 <= f.beta <= 5
    assert np.all(np.isfinite(f.predict(n, d)))


def test_flat_data_is_flagged_degenerate_and_has_no_plan() -> None:
    n, d = _grid_points(3)
    f = fit_chinchilla(n, d, np.full(n.size, 0.7), grid=FAST)
    assert np.allclose(f.predict(n, d), 0.7, rtol=1e-6)
    assert set(f.at_bounds) == {"alpha", "beta"}
    assert any("does not change with model size N" in w for w in f.warnings)
    with pytest.raises(BadInputError, match="no compute-optimal split"):
        compute_optimal(f, 1e12)


@pytest.mark.parametrize(
    ("n", "d", "loss", "match"),
    [
        ([1, 2, 3, 4, 5, 6], [1] * 6, [1, 1, 1, 1, -1, 1], "loss: point 4"),
        ([1, 2, 3, 4, 5, 6], [1] * 6, [1, 1, 1, 1, math.nan, 1], "finite number > 0"),
        ([0, 2, 3, 4, 5, 6], [1] * 6, [1] * 6, "n \\(model size\\): point 0"),
        ([1, 2, 3, 4, 5], [1] * 5, [1] * 5, "at least 6 points"),
        ([1, 2, 3, 4, 5, 6], [1] * 7, [1] * 6, "differ in length"),
    ],
)
def test_bad_data_raises_with_the_fix(n: list[float], d: list[float], loss: list[float],
                                      match: str) -> None:
    with pytest.raises(BadInputError, match=match):
        fit_chinchilla(n, d, loss, grid=FAST)


def test_predict_scalar_and_array() -> None:
    p = EPOCH_PARAMS
    v = p.predict(1e9, 2e10)
    assert isinstance(v, float)
    assert v == pytest.approx(1.8169 + 482.01 / 1e9**0.34781 + 2085.43 / 2e10**0.36585, rel=1e-12)
    arr = p.predict(np.array([1e9, 1e10]), 2e10)
    assert arr.shape == (2,) and arr[0] == pytest.approx(v)


@pytest.mark.parametrize("compute", [1e18, 1e21, 5.76e23, 1e26])
def test_closed_form_matches_numeric_optimum(compute: float) -> None:
    o = compute_optimal(EPOCH_PARAMS, compute)
    assert 6 * o.n_opt * o.d_opt == pytest.approx(compute, rel=1e-12)
    assert o.n_opt_numeric == pytest.approx(o.n_opt, rel=1e-5)
    # Brute force: no model size on a fine log grid beats the closed form.
    ns = np.geomspace(o.n_opt / 30, o.n_opt * 30, 20001)
    losses = EPOCH_PARAMS.predict(ns, compute / (6 * ns))
    assert losses.min() >= o.loss - 1e-12
    assert ns[np.argmin(losses)] == pytest.approx(o.n_opt, rel=1e-3)
    a, b = EPOCH_PARAMS.alpha, EPOCH_PARAMS.beta
    g = (a * EPOCH_PARAMS.A / (b * EPOCH_PARAMS.B)) ** (1 / (a + b))
    assert o.n_opt == pytest.approx(g * (compute / 6) ** (b / (a + b)), rel=1e-12)
    assert o.tokens_per_param == pytest.approx(o.d_opt / o.n_opt, rel=1e-12)


def test_marginal_loss_per_compute_and_per_doubling() -> None:
    c = 1e21
    o = compute_optimal(EPOCH_PARAMS, c)
    h = 1e-4
    fd = (compute_optimal(EPOCH_PARAMS, c * (1 + h)).loss
          - compute_optimal(EPOCH_PARAMS, c * (1 - h)).loss) / (2 * h * c)
    assert o.dloss_dcompute == pytest.approx(fd, rel=1e-6)
    assert o.dloss_dcompute < 0
    assert o.dloss_per_doubling == pytest.approx(
        compute_optimal(EPOCH_PARAMS, 2 * c).loss - o.loss, rel=1e-10)
    # Epoch's published law at 1e21 FLOP, by hand: N = G (C/6)^(b/(a+b)) with
    # G = (aA / bB)^(1/(a+b)), D = C / 6N, L = E + A/N^a + B/D^b.
    p = EPOCH_PARAMS
    g = (p.alpha * p.A / (p.beta * p.B)) ** (1 / (p.alpha + p.beta))
    n = g * (c / 6) ** (p.beta / (p.alpha + p.beta))
    d = c / (6 * n)
    assert o.n_opt == pytest.approx(n, rel=1e-12)
    assert o.tokens_per_param == pytest.approx(d / n, rel=1e-12)
    assert o.loss == pytest.approx(p.E + p.A / n**p.alpha + p.B / d**p.beta, rel=1e-12)


def test_evaluate_model_size_against_the_optimum() -> None:
    o = compute_optimal(EPOCH_PARAMS, 1e21)
    at_opt = evaluate_model_size(EPOCH_PARAMS, 1e21, o.n_opt)
    assert at_opt.excess_loss == pytest.approx(0.0, abs=1e-12)
    assert at_opt.compute_efficiency == pytest.approx(1.0, rel=1e-9)
    big = evaluate_model_size(EPOCH_PARAMS, 1e21, 1e10)
    assert big.excess_loss > 0 and 0 < big.compute_efficiency < 1
    # The optimal split at the equivalent compute reaches exactly that loss.
    assert compute_optimal(EPOCH_PARAMS, big.compute_for_same_loss).loss == pytest.approx(
        big.loss, rel=1e-10)


def test_bad_plan_inputs() -> None:
    with pytest.raises(BadInputError, match="compute must be"):
        compute_optimal(EPOCH_PARAMS, -1.0)
    with pytest.raises(BadInputError, match="5 numbers"):
        params_from_values([1.0, 2.0])
    with pytest.raises(BadInputError, match="alpha must be a finite number >= 0"):
        ChinchillaParams(E=1.0, A=1.0, B=1.0, alpha=-0.1, beta=0.3)
    with pytest.raises(BadInputError, match="model size"):
        evaluate_model_size(EPOCH_PARAMS, 1e21, 0.0)
    with pytest.raises(BadInputError, match="grid points"):
        StartGrid(points=0)


def test_one_model_size_is_fitted_but_flagged() -> None:
    n = np.full(8, 1e6)
    d = np.geomspace(1e3, 1e6, 8)
    loss = 2.0 + 30.0 / d**0.4
    f = fit_chinchilla(n, d, loss, grid=FAST)
    assert (f.B, f.beta) == pytest.approx((30.0, 0.4), rel=1e-4)
    assert f.predict(1e6, 5e4) == pytest.approx(2.0 + 30.0 / 5e4**0.4, rel=1e-6)
    assert any("same model size" in w for w in f.warnings)
