import math

import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.laws import (
    amdahl_limit,
    amdahl_speedup,
    amdahl_table,
    gustafson_speedup,
    gustafson_table,
    karp_flatt,
    usl_throughput,
)


def test_amdahl_table_reproduces_the_issue_figures() -> None:
    t = amdahl_table(0.95, [1, 8, 64, 512])
    got = [(r.workers, round(r.speedup, 1), round(r.efficiency * 100)) for r in t.rows]
    assert got == [(1, 1.0, 100), (8, 5.9, 74), (64, 15.4, 24), (512, 19.3, 4)]
    assert t.limit == pytest.approx(20.0)


def test_amdahl_exact_values() -> None:
    assert amdahl_speedup(0.5, 2) == pytest.approx(4 / 3)
    assert amdahl_speedup(1.0, 16) == 16.0
    assert amdahl_speedup(0.0, 16) == 1.0
    assert amdahl_limit(1.0) == math.inf


def test_gustafson_is_linear_in_workers() -> None:
    assert gustafson_speedup(0.95, 8) == pytest.approx(0.05 + 0.95 * 8)
    t = gustafson_table(0.9, [1, 10])
    assert [r.speedup for r in t.rows] == pytest.approx([1.0, 9.1])
    assert t.limit == math.inf


def test_karp_flatt_recovers_the_serial_fraction_of_amdahl() -> None:
    for n in (2, 8, 64):
        assert karp_flatt(amdahl_speedup(0.9, n), n) == pytest.approx(0.1)


def test_usl_reduces_to_amdahl_when_beta_is_zero() -> None:
    for n in (1, 4, 32):
        assert usl_throughput(n, 1.0, 0.05, 0.0) == pytest.approx(amdahl_speedup(0.95, n))


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_bad_fraction_is_a_user_error(p: float) -> None:
    with pytest.raises(BadInputError, match="between 0 and 1"):
        amdahl_speedup(p, 4)


def test_bad_workers_is_a_user_error() -> None:
    with pytest.raises(BadInputError):
        amdahl_speedup(0.5, 0)
    with pytest.raises(BadInputError):
        karp_flatt(1.5, 1)
