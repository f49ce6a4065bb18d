import numpy as np
import pytest

from scalelab.lab.core.fits import aic, fit_scaling
from scalelab.lab.core.usl import usl


def test_linear_data_chooses_the_linear_model() -> None:
    f = fit_scaling([1, 2, 4, 8], [10, 20, 40, 80])
    assert f.chosen == "linear"
    assert f.efficiency == pytest.approx([1.0, 1.0, 1.0, 1.0])
    assert f.karp_flatt[0] is None
    assert f.karp_flatt[1:] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)


def test_amdahl_data_chooses_amdahl_and_recovers_the_serial_fraction() -> None:
    n = np.array([1, 2, 4, 8, 16, 32], dtype=float)
    rng = np.random.default_rng(1)
    x = usl(n, 50.0, 0.1, 0.0) * (1 + rng.normal(0, 0.002, n.size))
    f = fit_scaling(n, x)
    assert f.chosen == "amdahl"
    am = f.model("amdahl")
    assert am is not None
    assert am.params["alpha"] == pytest.approx(0.1, rel=0.05)
    # Karp–Flatt of Amdahl data is the serial fraction at every level.
    assert [v for v in f.karp_flatt if v is not None] == pytest.approx([0.1] * 5, rel=0.05)


def test_retrograde_data_chooses_usl() -> None:
    n = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)
    rng = np.random.default_rng(2)
    x = usl(n, 100.0, 0.02, 0.004) * (1 + rng.normal(0, 0.005, n.size))
    f = fit_scaling(n, x)
    assert f.chosen == "usl"
    assert f.usl is not None and f.usl.n_peak == pytest.approx(np.sqrt(0.98 / 0.004), rel=0.1)


def test_medians_per_level_with_repeats() -> None:
    f = fit_scaling([1, 1, 1, 2, 2, 2], [9, 10, 30, 18, 20, 21])
    assert f.levels == [1.0, 2.0]
    assert f.throughput == [10.0, 20.0]


def test_aic_small_sample_correction() -> None:
    # n=5, k=2: 5·ln(1/5) + 4 + 2·2·3/(5−2−1)
    assert aic(1.0, 5, 2) == pytest.approx(5 * np.log(0.2) + 4 + 6)
