import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.knee import find_knee


def test_kneedle_paper_figure_2() -> None:
    # Satopää et al. 2011, Figure 2: y = -1/(x + 0.1) + 5 on [0, 1]; the knee is at x ≈ 0.22.
    x = np.linspace(0.0, 1.0, 10)
    y = -1.0 / (x + 0.1) + 5
    knee = find_knee(x, y, curve="concave", direction="increasing")
    assert knee == pytest.approx(0.2222, abs=1e-3)


def test_piecewise_linear_knee_is_exact() -> None:
    x = np.arange(0, 11, dtype=float)
    y = np.where(x <= 5, x, 5 + 0.1 * (x - 5))
    assert find_knee(x, y) == 5.0


def test_convex_latency_curve() -> None:
    load = np.arange(1, 11, dtype=float)
    latency = np.where(load <= 7, 10.0, 10.0 + 40.0 * (load - 7))
    assert find_knee(load, latency, curve="convex", direction="increasing") == 7.0


def test_straight_line_has_no_knee() -> None:
    assert find_knee([1, 2, 3, 4, 5], [2, 4, 6, 8, 10]) is None


def test_too_few_points_have_no_knee_and_bad_shapes_error() -> None:
    assert find_knee([1, 2], [1, 2]) is None
    with pytest.raises(BadInputError):
        find_knee([1, 2, 3], [1, 2])
