import numpy as np
import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.schedule import schedule, split


def test_constant_schedule_is_evenly_spaced() -> None:
    s = schedule(4.0, duration_s=1.0)
    assert s.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert schedule(10.0, requests=3).tolist() == [0.0, 0.1, 0.2]


def test_poisson_schedule_is_seeded_and_has_the_rate() -> None:
    a = schedule(1000.0, duration_s=20.0, arrival="poisson", seed=7)
    b = schedule(1000.0, duration_s=20.0, arrival="poisson", seed=7)
    assert np.array_equal(a, b)
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0) and a[-1] < 20.0
    # 20,000 expected arrivals: Poisson sd ~141, so 3% is > 4 sd.
    assert abs(len(a) - 20_000) < 600
    gaps = np.diff(a)
    assert abs(gaps.mean() - 1e-3) < 5e-5
    assert len(schedule(50.0, requests=17, arrival="poisson")) == 17


def test_split_round_robin_covers_the_schedule_once() -> None:
    s = schedule(100.0, requests=10)
    parts = [split(s, 3, i) for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == s.tolist()
    assert parts[0].tolist() == pytest.approx([0.0, 0.03, 0.06, 0.09])


@pytest.mark.parametrize("kw", [
    {"rate": 0, "duration_s": 1.0}, {"rate": 10, "duration_s": None},
    {"rate": 10, "duration_s": 1.0, "requests": 5}, {"rate": 10, "requests": 0},
    {"rate": 1e9, "duration_s": 1e3},
])
def test_bad_schedules_are_refused(kw: dict) -> None:
    rate = kw.pop("rate")
    with pytest.raises(BadUsageError):
        schedule(rate, **kw)
