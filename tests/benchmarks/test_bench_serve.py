"""benchmarks/bench_serve.py's capacity summary: the median and range of confirmed rates, and
each ratio taken repeat by repeat (the two servers searched back to back in one repeat)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_serve.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_serve_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_spread_is_median_and_range(bench: ModuleType) -> None:
    assert bench.spread([600.0, 100.0, 200.0]) == {"median": 200.0, "min": 100.0, "max": 600.0}


def test_ratios_pair_repeat_by_repeat(bench: ModuleType) -> None:
    # repeat by repeat: 600/300, 400/100, 900/300 -> 2, 4, 3; not the ratio of the medians
    # (600/300 = 2), nor of the rates sorted apart from their repeats
    out = bench.paired_ratios([600.0, 400.0, 900.0], [300.0, 100.0, 300.0])
    assert out == {"ratios": [2.0, 4.0, 3.0], "undefined": 0, "median": 3.0, "min": 2.0,
                   "max": 4.0}


def test_unconfirmed_peer_has_no_ratio_and_unconfirmed_ours_is_zero(bench: ModuleType) -> None:
    out = bench.paired_ratios([None, 600.0, 800.0], [100.0, None, 400.0])
    assert out == {"ratios": [0.0, 2.0], "undefined": 1, "median": 1.0, "min": 0.0, "max": 2.0}
    assert bench.paired_ratios([500.0], [None]) == {"ratios": [], "undefined": 1}


def test_repeat_starts_at_half_the_first_confirmed_rate_never_below_start(
        bench: ModuleType) -> None:
    assert bench.repeat_start(200.0, 5000.0) == 2500.0
    assert bench.repeat_start(200.0, 300.0) == 200.0  # half is 150: --start stays the floor
    assert bench.repeat_start(200.0, None) == 200.0  # nothing confirmed: a whole search again
