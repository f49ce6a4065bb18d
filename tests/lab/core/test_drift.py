import math

import numpy as np
import pytest

from scalelab.lab.core.drift import PSI_EPSILON, js_divergence, ks_2samp, ks_counts, linf, psi


def test_psi_by_hand_with_counts_or_shares_alike() -> None:
    # shares (0.5, 0.5) -> (0.25, 0.75): (0.25-0.5) ln(0.5) + (0.75-0.5) ln(1.5)
    expected = -0.25 * math.log(0.5) + 0.25 * math.log(1.5)
    assert psi(np.array([0.5, 0.5]), np.array([0.25, 0.75])) == pytest.approx(expected, rel=1e-12)
    assert psi(np.array([2, 2]), np.array([1, 3])) == pytest.approx(expected, rel=1e-12)
    # An empty current bin counts as PSI_EPSILON, not zero.
    empty = 0.5 * math.log(1.0 / 0.5) + (PSI_EPSILON - 0.5) * math.log(PSI_EPSILON / 0.5)
    assert psi(np.array([1.0, 1.0]), np.array([2.0, 0.0])) == pytest.approx(empty, rel=1e-12)
    assert psi(np.array([3.0, 1.0]), np.array([3.0, 1.0])) == 0.0


def test_linf_and_js_by_hand() -> None:
    assert linf({"a": 3, "b": 1}, {"a": 1, "b": 1, "c": 2}) == (0.5, "a")
    assert linf({"a": 0.5, "b": 0.5}, {"a": 0.2, "c": 0.8}) == (pytest.approx(0.8), "c")
    assert linf({"a": 1}, {"a": 5}) == (0.0, None)
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 1.0
    assert js_divergence(np.array([3.0, 5.0]), np.array([6.0, 10.0])) == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_ks_from_counts_matches_scipy_on_raw_values(seed: int) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 30, 200), rng.integers(3, 33, 150)
    d, p = ks_counts(dict(zip(*np.unique(x, return_counts=True), strict=True)),
                     dict(zip(*np.unique(y, return_counts=True), strict=True)))
    ref = scipy_stats.ks_2samp(x, y)
    assert d == pytest.approx(float(ref.statistic), abs=1e-12)
    assert ks_2samp(x, y) == (float(ref.statistic), float(ref.pvalue))
    # The asymptotic p-value: Kolmogorov's distribution at D sqrt(n m / (n + m)).
    assert p == pytest.approx(float(scipy_stats.kstwobign.sf(d * math.sqrt(200 * 150 / 350))))


def test_ks_needs_values_on_both_sides() -> None:
    with pytest.raises(ValueError, match="both sides"):
        ks_counts({1: 3}, {})
