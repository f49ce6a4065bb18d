import math

import pytest

from scalelab.core.errors import BadUsageError
from scalelab.load.capacity import (
    SearchConfig,
    Step,
    StepRule,
    clopper_pearson,
    quantile_ranks,
    search,
)
from scalelab.load.generator import Progress
from scalelab.load.slo import parse_slo


def test_clopper_pearson_closed_forms() -> None:
    # k = n: lower bound is (alpha/2)^(1/n); k = 0: upper is 1 - (alpha/2)^(1/n).
    lo, hi = clopper_pearson(100, 100, 0.95)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 100))
    lo, hi = clopper_pearson(0, 50, 0.95)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 50))


def test_quantile_ranks_bracket_the_quantile() -> None:
    lo, hi = quantile_ranks(1000, 0.95, 0.95)
    assert lo < 950 < hi
    assert (lo, hi) == (936, 964)


def test_step_rule_decides_by_the_interval() -> None:
    rule = StepRule(slo=parse_slo("p95<50ms"), confidence=0.95, min_step_s=1.0)
    # 100/100 within: lower bound 0.9638 > 0.95 -> pass, decided.
    assert rule.verdict(ok=100, within=100, errors=0) == ("pass", True)
    # 50/100 within: upper bound < 0.95 -> fail, decided.
    assert rule.verdict(ok=100, within=50, errors=0) == ("fail", True)
    # 96/100: point estimate passes but the interval straddles 0.95.
    assert rule.verdict(ok=100, within=96, errors=0) == ("pass", False)
    assert not rule.should_stop(Progress(sent=100, ok=100, errors=0, within=100, elapsed_s=0.5))
    assert rule.should_stop(Progress(sent=100, ok=100, errors=0, within=100, elapsed_s=1.5))
    assert not rule.should_stop(Progress(sent=100, ok=100, errors=0, within=96, elapsed_s=1.5))
    budgeted = StepRule(slo=parse_slo("p95<50ms", error_budget="1%"))
    assert budgeted.verdict(ok=1000, within=1000, errors=100) == ("fail", True)


def test_step_rule_needs_one_latency_objective() -> None:
    with pytest.raises(BadUsageError):
        StepRule(slo=parse_slo("p95<50ms,p99<90ms"))


def _fake(capacity: float, calls: list[float]):
    def run(rate: float) -> Step:
        calls.append(rate)
        ok = rate <= capacity
        return Step(rate=rate, verdict="pass" if ok else "fail", requests=100,
                    throughput_rps=min(rate, capacity), quantile_ms=10.0 if ok else 500.0,
                    quantile_ci_ms=(None, None), error_rate=0.0, valid=True, wall_s=1.0)
    return run


def test_search_doubles_then_bisects_to_the_precision() -> None:
    calls: list[float] = []
    res = search(_fake(100.0, calls), SearchConfig(start=10, precision=0.05))
    assert calls == [10, 20, 40, 80, 160, 120, 100, 110, 105]
    assert res.interval_rps == (100, 105)
    assert res.capacity_rps == 100 and res.converged
    lo, hi = res.interval_rps
    assert lo is not None and hi is not None and lo <= 100 <= hi


def test_search_goes_down_when_the_start_fails_and_caps_at_max_rate() -> None:
    calls: list[float] = []
    res = search(_fake(3.0, calls), SearchConfig(start=10, precision=0.5))
    assert calls[:3] == [10, 5, 2.5]
    assert res.capacity_rps is not None and res.capacity_rps <= 3.0
    calls = []
    res = search(_fake(math.inf, calls), SearchConfig(start=10, max_rate=50))
    assert calls == [10, 20, 40, 50] and res.capacity_rps == 50 and res.converged
