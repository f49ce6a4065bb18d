import math

import pytest

from scalelab.lab.core.decide import clopper_pearson, min_passing, quantile_ranks, step_requests
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.capacity import (
    Deadline,
    Progress,
    SearchConfig,
    Step,
    StepRule,
    confirmed_search,
    search,
)
from scalelab.lab.load.slo import parse_slo


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
    rule = StepRule(slo=parse_slo("p95<50ms"), confidence=0.95, min_step_s=1.0, min_requests=100)
    # 100/100 within: lower bound 0.9638 > 0.95 -> pass, decided.
    assert rule.verdict(ok=100, within=100, errors=0) == ("pass", True)
    # 50/100 within: upper bound < 0.95 -> fail, decided.
    assert rule.verdict(ok=100, within=50, errors=0) == ("fail", True)
    # 96/100: point estimate passes but the interval straddles 0.95.
    assert rule.verdict(ok=100, within=96, errors=0) == ("pass", False)
    assert not rule.should_stop(Progress(sent=100, ok=100, errors=0, within=100), 0.5)
    assert rule.should_stop(Progress(sent=100, ok=100, errors=0, within=100), 1.5)
    assert not rule.should_stop(Progress(sent=100, ok=100, errors=0, within=96), 1.5)
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


def test_min_passing_is_loadgens_early_stopping_count() -> None:
    # No request over the threshold: ceil(ln(1 - c) / ln(q)), LoadGen's 459 for p99 at 99%.
    assert min_passing(0, 0.99, 0.99) == 459 == math.ceil(math.log(0.01) / math.log(0.99))
    assert min_passing(0, 0.95, 0.975) == 72
    # Each request over the threshold needs more within it beside it.
    assert min_passing(5, 0.99, 0.99) == 1302
    assert min_passing(1, 0.99, 0.99) > min_passing(0, 0.99, 0.99)


def test_step_requests_follow_the_stated_rule() -> None:
    # Two-sided 95% = one-sided 97.5%, passing a server at half its tail allowance.
    assert step_requests(0.99, 0.95) == 1164
    assert step_requests(0.95, 0.95) == 230
    assert step_requests(0.90, 0.95) == 100
    assert step_requests(0.50, 0.95) == 15
    assert step_requests(0.999, 0.95) == 11665
    # n = 1164 is the first n where h(t) + t <= n for t = floor(0.005 n) = 5.
    assert min_passing(5, 0.99, 0.975) + 5 <= 1164
    assert min_passing(5, 0.99, 0.975) + 5 > 1163
    # The same rule at LoadGen's own 99%.
    assert step_requests(0.99, 0.98) == 1596


def test_a_step_may_not_decide_before_its_requests() -> None:
    rule = StepRule(slo=parse_slo("p99<200ms"), min_step_s=1.0)
    assert rule.requests_needed == 1164
    full = Progress(sent=1163, ok=1163, errors=0, within=1163)
    assert rule.verdict(ok=1163, within=1163, errors=0) == ("pass", True)
    assert not rule.should_stop(full, 20.0)
    assert rule.should_stop(Progress(sent=1164, ok=1164, errors=0, within=1164), 20.0)
    assert rule.step_verdict(sent=1163, ok=1163, within=1163, errors=0) == "undecided-pass"
    assert rule.step_verdict(sent=1164, ok=1164, within=1164, errors=0) == "pass"
    assert rule.step_verdict(sent=1200, ok=1200, within=1000, errors=0) == "fail"
    # The step's length still bounds it.
    assert rule.should_stop(Progress(sent=10, ok=10, errors=0, within=10), 60.0)
    assert StepRule(slo=parse_slo("p99<200ms"), min_requests=50).requests_needed == 50
    with pytest.raises(BadUsageError):
        StepRule(slo=parse_slo("p99<200ms"), min_requests=0)


def test_an_invalid_step_is_run_again_before_it_counts() -> None:
    calls: list[float] = []
    flaky = {40.0: 1}  # the first try at 40 req/s is invalid (a stalled generator) and fails

    def run(rate: float) -> Step:
        calls.append(rate)
        stalled = flaky.get(rate, 0) > 0
        if stalled:
            flaky[rate] -= 1
        ok = rate <= 100 and not stalled
        return Step(rate=rate, verdict="pass" if ok else "fail", requests=100,
                    throughput_rps=rate, quantile_ms=10.0, quantile_ci_ms=(None, None),
                    error_rate=0.0, valid=not stalled, wall_s=1.0)

    res = search(run, SearchConfig(start=10, precision=0.05))
    assert calls[:5] == [10, 20, 40, 40, 80]
    assert res.capacity_rps == 100
    calls.clear()
    flaky[40.0] = 1
    res = search(run, SearchConfig(start=10, precision=0.05, invalid_retries=0))
    # Not run again, the stall is the generator's ceiling: never a pass, nor a capacity.
    assert calls == [10, 20, 40]
    assert (res.capacity_rps, res.generator_limit_rps, res.at_least) == (20, 40, True)
    assert res.answer() == ("at least 20 req/s, the generator's limit here (it could not offer "
                            "40 req/s) (not confirmed: no confirmation run)")


def test_the_stop_rule_decides_a_share_and_a_budget_on_the_interval() -> None:
    rule = StepRule(slo=parse_slo("p95<50ms"))
    # 100 of 100: the interval's lower end is 0.025^(1/100) = 0.9638 >= 0.95.
    assert rule.share_verdict(100, 100, 0.95) == "pass"
    # 80 of 100: even the upper end (0.873) is under 0.95.
    assert rule.share_verdict(80, 100, 0.95) == "fail"
    assert rule.share_verdict(95, 100, 0.95) is None
    assert rule.share_verdict(0, 0, 0.95) is None
    # 0 errors of 1,000: the upper end 1 - 0.025^(1/1000) = 0.0037 is within a 1% budget;
    # of 100 it is 0.036 (undecided); 10 of 100 has its lower end at 0.049, over the budget.
    assert rule.budget_verdict(0, 1000, 0.01) == "pass"
    assert rule.budget_verdict(0, 100, 0.01) is None
    assert rule.budget_verdict(10, 100, 0.01) == "fail"


def test_each_rule_keeps_its_own_limits_on_the_shared_stop() -> None:
    from scalelab.lab.load.llm.token_slo import TokenStepRule, parse_token_slo

    http = StepRule(slo=parse_slo("p95<50ms"))
    llm = TokenStepRule(slo=parse_token_slo("ttft_p95<500ms"))
    assert (http.max_step_s, http.max_requests) == (60.0, 200_000)
    assert (llm.max_step_s, llm.max_requests) == (30.0, 100_000)
    assert llm.out_of_room(30.0, 0) and llm.out_of_room(0.0, 100_000)
    assert not llm.out_of_room(29.9, 99_999)
    with pytest.raises(BadUsageError, match="--confidence must be in"):
        TokenStepRule(slo=parse_token_slo("ttft_p95<500ms"), confidence=0.4)
    with pytest.raises(BadUsageError, match="--min-step must be positive"):
        StepRule(slo=parse_slo("p95<50ms"), min_step_s=90.0)


def test_a_rate_known_to_fail_bounds_the_search_from_above() -> None:
    # A level sweep decided 400 missed: the search doubles 200 -> (400 is known) and bisects
    # below it; it never offers 400 or more.
    calls: list[float] = []
    res = search(_fake(280.0, calls), SearchConfig(start=200, precision=0.05, fails_at=400))
    assert calls == [200, 300, 250, 275, 287.5]
    assert res.interval_rps == (275, 287.5) and res.capacity_rps == 275 and res.converged
    # The start fails: halve down as without the bound, the bound still the ceiling.
    calls = []
    res = search(_fake(90.0, calls), SearchConfig(start=200, precision=0.2, fails_at=400))
    assert calls == [200, 100, 50, 75, 87.5]
    assert res.interval_rps == (87.5, 100) and res.converged
    # Unbounded, the same truth costs a step at the failing rate the sweep already measured.
    calls = []
    search(_fake(280.0, calls), SearchConfig(start=200, precision=0.05))
    assert calls == [200, 400, 300, 250, 275, 287.5]


def test_a_known_fail_must_lie_above_the_start() -> None:
    with pytest.raises(BadUsageError, match="--fails-at 100 must be above --start 200"):
        SearchConfig(start=200, fails_at=100)


def _step(rate: float, ok: bool, *, valid: bool = True, confirmation: bool = False) -> Step:
    return Step(rate=rate, verdict="pass" if ok else "fail", requests=100, throughput_rps=rate,
                quantile_ms=10.0, quantile_ci_ms=(None, None), error_rate=0.0, valid=valid,
                wall_s=30.0 if confirmation else 1.0, confirmation=confirmation)


def test_a_step_the_generator_could_not_offer_never_passes() -> None:
    # The server would pass every rate; the generator cannot offer 80 or more.
    calls: list[float] = []

    def run(rate: float) -> Step:
        calls.append(rate)
        return _step(rate, True, valid=rate < 80)

    res = search(run, SearchConfig(start=10, precision=0.05))
    assert calls == [10, 20, 40, 80, 80]  # 80 run again once, still not offered
    assert not res.steps[-1].passed and res.steps[-1].server_passed
    assert (res.capacity_rps, res.interval_rps, res.generator_limit_rps) == (40, (40, None), 80)
    assert not res.converged


def test_a_failed_confirmation_sends_the_search_below_it() -> None:
    # Short steps pass up to 100 req/s, but only 90 holds for a confirmation's length.
    calls: list[tuple[float, bool]] = []

    def step(rate: float) -> Step:
        calls.append((rate, False))
        return _step(rate, rate <= 100)

    def confirm(rate: float) -> Step:
        calls.append((rate, True))
        return _step(rate, rate <= 90, confirmation=True)

    res = confirmed_search(step, confirm, SearchConfig(start=25, precision=0.05))
    # 25 → 50 → 100 → 200 ✗ → 150 ✗ → 125 ✗ → 112.5 ✗ → 106.25 ✗ → 103.125 ✗; 100 fails its
    # confirmation; the search goes on 10% below (twice the precision): 90 passes, and holds.
    assert calls[-4:] == [(103.125, False), (100, True), (90, False), (90, True)]
    assert res.confirmed_rps == 90 == res.capacity_rps and res.interval_rps == (90, 100)
    assert [s.rate for s in res.confirmations] == [100, 90]
    assert res.answer() == ("capacity 90 req/s, confirmed by 30 s at that rate (100 "
                            "requests, served 90 req/s)")
    # Never confirmed: the search goes on lower, 10% at a time, while the 20 steps last: the
    # first search took 9, each search below takes one (it passes at once), so 12
    # confirmations (100 × 0.9^k), and the answer says the budget stopped it.
    res = confirmed_search(step, lambda r: _step(r, False, confirmation=True),
                           SearchConfig(start=25, precision=0.05))
    assert [s.rate for s in res.confirmations] == pytest.approx([100 * 0.9 ** k
                                                                 for k in range(12)])
    assert sum(not s.confirmation for s in res.steps) == 20
    assert (res.confirmed_rps, res.capacity_rps) == (None, None)
    assert res.interval_rps == (None, pytest.approx(100 * 0.9 ** 11))
    assert res.answer() == ("no confirmed capacity: the step budget ran out after 12 "
                            "confirmation(s) (20 steps in all; the last at 31.38 req/s failed)")


def test_confirmations_go_on_lower_until_one_holds() -> None:
    # Short steps pass up to 100 req/s; only a rate under 70 holds a confirmation's length.
    def step(rate: float) -> Step:
        return _step(rate, rate <= 100)

    def confirm(rate: float) -> Step:
        return _step(rate, rate < 70, confirmation=True)

    res = confirmed_search(step, confirm, SearchConfig(start=25, precision=0.05))
    # 100, 90, 81, 72.9 fail; 65.61 (the first of 100 × 0.9^k under 70) holds.
    assert [s.rate for s in res.confirmations] == pytest.approx([100, 90, 81, 72.9, 65.61])
    assert res.confirmed_rps == res.capacity_rps == pytest.approx(65.61)
    assert res.interval_rps == pytest.approx((65.61, 72.9)) and res.stopped is None


def test_a_time_budget_starts_nothing_it_cannot_finish() -> None:
    # A clock the steps move: a search step takes 1 s, a confirmation 30 s.
    now = [0.0]

    def step(rate: float) -> Step:
        now[0] += 1.0
        return _step(rate, rate <= 100)

    def confirm(rate: float) -> Step:
        now[0] += 30.0
        return _step(rate, rate < 70, confirmation=True)

    def budget(seconds: float) -> Deadline:
        now[0] = 0.0
        return Deadline(seconds, step_s=1.0, confirm_s=30.0, clock=lambda: now[0])

    cfg = SearchConfig(start=25, precision=0.05)
    # 100 s: the 9 steps (9 s), 100's confirmation (to 39 s), the step at 90 and its
    # confirmation (to 70 s); another step and confirmation would end at 101 s.
    res = confirmed_search(step, confirm, cfg, deadline=budget(100))
    assert [s.rate for s in res.confirmations] == [100, 90] and now[0] == 70
    assert (res.capacity_rps, res.confirmed_rps) == (None, None)
    assert res.answer() == ("no confirmed capacity: the time budget (100 s) ran out after 2 "
                            "confirmation(s) (the last at 90 req/s failed)")
    # 20 s: the search's answer, left unconfirmed (and said so).
    res = confirmed_search(step, confirm, cfg, deadline=budget(20))
    assert (res.capacity_rps, res.confirmed_rps, res.confirmations) == (100, None, [])
    assert res.answer() == ("capacity 100 req/s (not confirmed: the time budget (20 s) ran out "
                            "before the answer's confirmation)")
    # 5 s: five steps, the last starting at 4 s; 0.5 s: the first step still runs (a search
    # of no step says nothing).
    res = confirmed_search(step, confirm, cfg, deadline=budget(5))
    assert [s.rate for s in res.steps] == [25, 50, 100, 200, 150] and not res.converged
    res = confirmed_search(step, confirm, cfg, deadline=budget(0.5))
    assert [s.rate for s in res.steps] == [25] and res.capacity_rps == 25


def test_confirmations_stop_at_the_floor() -> None:
    # Nothing holds a confirmation: with steps to spare the floor (--min-rate 40) stops it.
    res = confirmed_search(lambda r: _step(r, r <= 100),
                           lambda r: _step(r, False, confirmation=True),
                           SearchConfig(start=50, min_rate=40, precision=0.05, max_steps=40))
    assert [s.rate for s in res.confirmations] == pytest.approx([100 * 0.9 ** k
                                                                 for k in range(9)])
    assert res.capacity_rps is None and res.confirmed_rps is None
    assert res.answer() == ("no confirmed capacity: no rate held down to 40 req/s, the "
                            "search's floor (9 confirmation(s) failed, the last at 43.05 req/s)")
    # The short steps below a failed confirmation fail too: the search halves down to the
    # floor (25 / 64 by default) and says how low it went.
    confirmed: list[float] = []

    def confirm(rate: float) -> Step:
        confirmed.append(rate)
        return _step(rate, False, confirmation=True)

    res = confirmed_search(lambda r: _step(r, r <= 100 and not confirmed), confirm,
                           SearchConfig(start=25, precision=0.05))
    below = [s.rate for s in res.steps[res.steps.index(res.confirmations[0]) + 1:]]
    assert below == [90, 45, 22.5, 11.25, 5.625, 2.8125, 1.40625, 0.703125]
    assert res.answer() == ("no confirmed capacity: no rate held down to 0.7031 req/s (1 "
                            "confirmation(s) failed; the search's floor is 0.3906 req/s)")


def test_an_invalid_step_below_an_offered_rate_is_a_stall_not_a_ceiling() -> None:
    # The generator offered up to 200 req/s; after the confirmation at 100 failed, the step at
    # 90 is invalid twice (the machine stalled) and valid the third time: run again, not the
    # generator's ceiling, and the search goes on to confirm 90.
    tries = {90.0: 0}

    def step(rate: float) -> Step:
        if rate == 90:
            tries[90] += 1
        return _step(rate, rate <= 100, valid=rate != 90 or tries[90] > 2)

    res = confirmed_search(step, lambda r: _step(r, r <= 90, confirmation=True),
                           SearchConfig(start=25, precision=0.05))
    assert tries[90] == 3 and res.generator_limit_rps is None
    assert res.confirmed_rps == res.capacity_rps == 90
    # An invalid confirmation (the search offered its rate in a step) is run again before it
    # counts: the second, valid, holds the answer.
    runs: list[bool] = []

    def confirm(rate: float) -> Step:
        runs.append(rate == 100)
        return _step(rate, True, valid=len(runs) > 1, confirmation=True)

    res = confirmed_search(lambda r: _step(r, r <= 100), confirm,
                           SearchConfig(start=25, precision=0.05))
    assert runs == [True, True] and res.confirmed_rps == 100
    # Above every rate offered, an invalid step run again once is still the ceiling.
    res = search(lambda r: _step(r, True, valid=r < 80), SearchConfig(start=10))
    assert res.generator_limit_rps == 80 and [s.rate for s in res.steps] == [10, 20, 40, 80, 80]


def test_a_stall_is_run_again_three_times_then_the_search_stops() -> None:
    # Offered up to 100 req/s; every step at 90 is invalid: run 1 + STALL_RETRIES times, then
    # the search stops without a ceiling (a stall, not the generator's limit), steps unspent.
    tries = {90.0: 0}

    def step(rate: float) -> Step:
        tries[90.0] += rate == 90
        return _step(rate, rate <= 100, valid=rate != 90)

    res = confirmed_search(step, lambda r: _step(r, r <= 90, confirmation=True),
                           SearchConfig(start=25, precision=0.05, max_steps=40))
    assert tries[90.0] == 4 and res.generator_limit_rps is None
    assert len(res.steps) < 40


def test_a_failed_confirmation_forgets_a_ceiling_met_above_it() -> None:
    # The generator cannot offer 80 (its ceiling: the answer "at least 40"); the confirmation
    # at 40, offered, fails: the capacity is below 40, so no "at least" is left on the answer.
    res = confirmed_search(lambda r: _step(r, True, valid=r < 80),
                           lambda r: _step(r, r <= 36, confirmation=True),
                           SearchConfig(start=10, precision=0.05))
    assert res.steps[4].rate == 80 and not res.steps[4].valid
    assert res.confirmed_rps == 36 and res.generator_limit_rps is None


def test_failures_that_decide_availability_missed_fail_the_step_at_once() -> None:
    # No availability objective given: the default 99% is judged, for misses only.
    rule = StepRule(slo=parse_slo("p95<50ms"), min_step_s=3.0)
    # 30 of 100 refused: decided missed (the lower bound 0.21 > 1%) before any floor.
    assert rule.availability_missed(ok=70, errors=30)
    assert rule.verdict(ok=70, within=70, errors=30) == ("fail", True)
    assert rule.should_stop(Progress(sent=100, ok=70, errors=30, within=70), 0.2)
    assert rule.step_verdict(sent=10_000, ok=7_000, within=7_000, errors=3_000) == "fail"
    # 1 of 300 failed: not decided missed, and passing it is not required per step.
    assert not rule.availability_missed(ok=299, errors=1)
    assert rule.step_verdict(sent=300, ok=299, within=299, errors=1) == "pass"
    assert not rule.should_stop(Progress(sent=100, ok=99, errors=1, within=99), 0.2)
    # 5 of 300 failed (1.7%): not decided missed (the lower bound is 0.54%), but over the
    # default 1% budget, so the step does not pass on its latency: it runs on, undecided.
    assert not rule.availability_missed(ok=295, errors=5)
    assert rule.verdict(ok=295, within=295, errors=5) == ("fail", False)
    assert rule.step_verdict(sent=300, ok=295, within=295, errors=5) == "undecided-fail"


def test_a_step_that_is_not_steady_fails_whatever_its_latency() -> None:
    from scalelab.lab.load.steady import SteadyTrace, judge

    rule = StepRule(slo=parse_slo("p95<50ms"))
    flat = SteadyTrace(n=[10] * 30, lat_s=[0.1] * 30, sent=300, served=300, span_s=3.0)
    behind = SteadyTrace(n=[10] * 30, lat_s=[0.1] * 30, sent=300, served=240, span_s=3.0)
    counts = {"sent": 300, "ok": 300, "within": 300, "errors": 0}
    assert rule.step_verdict(**counts, steady=judge(flat, threshold_s=0.05,
                                                    confidence=0.95)) == "pass"
    assert rule.step_verdict(**counts, steady=judge(behind, threshold_s=0.05,
                                                    confidence=0.95)) == "fail"
