import math

import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.usl import fit_usl, usl

N = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)


def test_recovers_exact_parameters_from_noiseless_data() -> None:
    f = fit_usl(N, usl(N, 1000.0, 0.05, 0.002))
    assert f.gamma.value == pytest.approx(1000.0, rel=1e-6)
    assert f.alpha.value == pytest.approx(0.05, rel=1e-6)
    assert f.beta.value == pytest.approx(0.002, rel=1e-6)
    assert f.n_peak == pytest.approx(math.sqrt(0.95 / 0.002), rel=1e-6)
    assert f.n_opt == pytest.approx(20.0, rel=1e-6)
    assert f.x_limit == pytest.approx(20000.0, rel=1e-5)
    assert f.rse == pytest.approx(0.0, abs=1e-6)


def test_noisy_data_gives_intervals_that_cover_the_truth() -> None:
    n = np.repeat(N, 3)
    truth = (200.0, 0.03, 0.0005)
    covered = np.zeros(3)
    trials = 40
    rse2: list[float] = []
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        x = usl(n, *truth) + rng.normal(0, 2.0, n.size)
        f = fit_usl(n, x, confidence=0.95)
        for i, p in enumerate((f.gamma, f.alpha, f.beta)):
            assert p.stderr is not None and p.stderr > 0
            assert p.ci_low is not None and p.ci_high is not None
            covered[i] += p.ci_low <= truth[i] <= p.ci_high
        assert f.rse is not None
        rse2.append(f.rse**2)
        assert len(f.fitted) == n.size
    # 95% intervals with constant-variance noise: coverage near 0.95 for every parameter.
    assert np.all(covered / trials >= 0.85)
    # The residual standard error estimates the noise: E[rse²] = σ² = 4.
    assert np.mean(rse2) == pytest.approx(4.0, rel=0.2)


def test_linear_data_puts_both_penalties_at_zero() -> None:
    f = fit_usl([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    assert f.alpha.value == 0.0 and f.beta.value == 0.0
    assert f.n_peak == math.inf and f.x_limit == math.inf
    # A parameter on its bound has no symmetric interval.
    assert f.alpha.ci_low is None


def test_three_points_fit_without_standard_errors() -> None:
    f = fit_usl([1, 2, 4], list(usl(np.array([1.0, 2, 4]), 10, 0.1, 0.01)))
    assert f.rse is None and f.alpha.stderr is None
    assert f.alpha.value == pytest.approx(0.1, rel=1e-5)


@pytest.mark.parametrize(
    ("n", "x", "msg"),
    [
        ([1, 2], [1, 2], "at least 3 distinct"),
        ([1, 2, 3], [1, 2], "as many"),
        ([0, 1, 2], [1, 2, 3], ">= 1"),
        ([1, 2, 3], [1, -2, 3], ">= 0"),
        ([1, 2, 3], [1, float("nan"), 3], "finite"),
    ],
)
def test_bad_series_are_user_errors(n: list[float], x: list[float], msg: str) -> None:
    with pytest.raises(BadInputError, match=msg):
        fit_usl(n, x)
