"""Deciding objectives: exact numbers, checked against closed forms computed here without scipy."""

import math

import pytest

from recordkit import M, rec
from scalelab.lab.core.decide import (
    binomial_bounds,
    decide_point,
    decide_quantile,
    decide_rate,
    decide_spread,
    order_ranks,
    quantile_bounds,
    quantile_requests_needed,
    trials_needed,
)
from scalelab.lab.core.objectives import Objective, check_rows
from scalelab.lab.core.records import Latency, Record, make_record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.report.verdict_text import decided_text, gap_text, headline, open_text


def _lrec(level: float, *, repeat: int = 0, **kw: object) -> Record:
    return make_record(experiment="t", stage="serve", variable="rate", level=level,
                       repeat=repeat, machine=M, **kw)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) ≤ k) by the plain sum (independent of scipy)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_zero_failures_clopper_pearson_matches_the_closed_form() -> None:
    # With 0 failures the one-sided upper bound is 1 − α^(1/n) exactly.
    for n in (10, 1180, 2995):
        assert binomial_bounds(0, n)[1] == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-9)
        assert binomial_bounds(0, n)[0] == 0.0
    # n ≥ ln(α)/ln(1 − p): 2,995 trials without a failure show a rate under 0.1% at 95%.
    need = math.ceil(math.log(0.05) / math.log(1 - 0.001))
    assert need == 2995 == trials_needed(0, 0.001)
    assert binomial_bounds(0, 2995)[1] < 0.001 < binomial_bounds(0, 2994)[1]
    # 99% availability: ⌈ln 0.05 / ln 0.99⌉ = 299.
    assert trials_needed(0, 0.01) == math.ceil(math.log(0.05) / math.log(0.99)) == 299


def test_clopper_pearson_with_failures_is_the_binomial_tail() -> None:
    # The upper bound u solves P(Bin(n, u) ≤ k) = α; check the defining equation directly.
    lo, hi = binomial_bounds(3, 1000)
    assert _binom_cdf(3, 1000, hi) == pytest.approx(0.05, rel=1e-6)
    assert 1 - _binom_cdf(2, 1000, lo) == pytest.approx(0.05, rel=1e-6)
    n = trials_needed(3, 0.001)
    assert binomial_bounds(3, n)[1] < 0.001 <= binomial_bounds(3, n - 1)[1]


def test_availability_decisions_and_what_deciding_needs() -> None:
    und = decide_rate(0, 1180, value=1.0, minimum=0.999, maximum=None, complement=True)
    assert und.outcome == "undecided" and und.n == 1180 and und.confidence == 0.95
    assert und.need == "1,180 requests; 99.9% needs ≥ 2,995 without a failure"
    assert und.lower == pytest.approx(0.05 ** (1 / 1180), rel=1e-9)
    met = decide_rate(0, 2995, value=1.0, minimum=0.999, maximum=None, complement=True)
    assert met.outcome == "met" and met.need == ""
    assert decide_rate(0, 2994, value=1.0, minimum=0.999, maximum=None,
                       complement=True).outcome == "undecided"
    # 10 failures of 1,000: the lower bound on the failure rate (0.0054) is over 0.1%.
    miss = decide_rate(10, 1000, value=0.99, minimum=0.999, maximum=None, complement=True)
    assert miss.outcome == "missed"
    assert miss.upper == pytest.approx(1 - binomial_bounds(10, 1000)[0])
    # Failure-rate objectives read the same counts directly.
    fr = decide_rate(0, 100, value=0.0, minimum=None, maximum=0.05)
    assert fr.outcome == "met" and fr.upper == pytest.approx(1 - 0.05 ** (1 / 100))
    assert decide_rate(0, 50, value=0.0, minimum=None, maximum=0.05).need == (
        "50 requests; a failure rate ≤ 5% needs ≥ 59 without a failure")
    # No sample size: undecided, said so; no value: not measured.
    assert decide_rate(None, None, value=0.0, minimum=None, maximum=0.05).need == (
        "sample size not recorded (0 measured)")
    assert decide_rate(0, 10, value=None, minimum=None, maximum=0.05).outcome == "not measured"


def test_order_statistic_ranks_are_the_binomial_quantiles() -> None:
    # u: the smallest rank with P(Bin(n, q) ≤ u − 1) ≥ 95%; l: the largest with
    # P(Bin(n, q) ≥ l) ≥ 95%, each found here by the plain sum.
    n, q = 1000, 0.95
    cdf = [_binom_cdf(k, n, q) for k in range(900, 1000)]  # P(Bin ≤ k) for k = 900..999

    def at(k: int) -> float:
        return cdf[k - 900]

    u = next(r for r in range(901, n + 1) if at(r - 1) >= 0.95)
    low = max(r for r in range(901, n + 1) if 1 - at(r - 1) >= 0.95)
    assert at(899 + 1) < 1e-6  # nothing below rank 900 matters for either bound
    assert order_ranks(n, q) == (low, u) == (938, 962)
    # With 6 requests no order statistic bounds p95 from above: 1 − 0.95⁶ = 0.265 < 95%.
    assert order_ranks(6, 0.95)[1] is None
    assert quantile_requests_needed(0.95) == math.ceil(math.log(0.05) / math.log(0.95)) == 59
    assert order_ranks(59, 0.95)[1] == 59 and order_ranks(58, 0.95)[1] is None


def test_quantile_bounds_read_the_recorded_quantiles_conservatively() -> None:
    rec_q = {0.5: 10.0, 0.9: 20.0, 0.95: 30.0, 0.99: 40.0, 0.999: 60.0, 1.0: 80.0}
    # n = 1000, p95: u = 962 → the first recorded rank ≥ 962 is p99 (990); l = 938 → the
    # last recorded rank ≤ 938 is p90 (900).
    assert quantile_bounds(rec_q, 1000, 0.95) == (20.0, 40.0)
    assert decide_quantile(0.95, rec_q, 1000, value=30.0, minimum=None,
                           maximum=50).outcome == "met"
    assert decide_quantile(0.95, rec_q, 1000, value=30.0, minimum=None,
                           maximum=15).outcome == "missed"
    mid = decide_quantile(0.95, rec_q, 1000, value=30.0, minimum=None, maximum=35)
    assert mid.outcome == "undecided"
    assert mid.need == "1,000 requests: upper bound 40 straddles the limit; more requests decide it"
    # The bound equal to the limit has not shown it is under.
    assert decide_quantile(0.95, rec_q, 1000, value=30.0, minimum=None,
                           maximum=40).outcome == "undecided"
    # Six TTFTs: p95 is the maximum and no bound exists above it, whatever the value.
    six = decide_quantile(0.95, rec_q, 6, value=30.0, minimum=None, maximum=2000)
    assert six.outcome == "undecided" and six.upper is None
    assert six.need == "6 requests; p95 needs ≥ 59 to bound it at 95%"
    no_n = decide_quantile(0.95, rec_q, None, value=30.0, minimum=None, maximum=2000)
    assert no_n.outcome == "undecided" and no_n.need == "sample size not recorded (30 measured)"


def test_spreads_over_repeats_and_points() -> None:
    assert decide_spread(100, 90, 120, repeats=3, minimum=80, maximum=None).outcome == "met"
    assert decide_spread(100, 90, 120, repeats=3, minimum=130, maximum=None).outcome == "missed"
    s = decide_spread(100, 90, 120, repeats=3, minimum=95, maximum=None)
    assert s.outcome == "undecided" and s.basis == "repeats"
    assert s.need == (
        "3 repeats span 90–120 across the limit: more repeats or longer levels decide it")
    one = decide_spread(100, 100, 100, repeats=1, minimum=95, maximum=None)
    assert one.outcome == "met" and one.basis == "point (1 repeat)" and one.n == 1
    assert decide_point(0.94, minimum=0.95, maximum=None).outcome == "missed"
    assert decide_point(None, minimum=0.95, maximum=None).outcome == "not measured"


def test_sheet_carries_sample_counts_and_old_records_read_as_not_recorded() -> None:
    lat = Latency(p50_ms=5, p90_ms=8, p95_ms=9, p99_ms=12, p999_ms=20, max_ms=30)
    new = [_lrec(10, repeat=i, rate=10, latency=lat, failure_rate=0.0,
                 extras={"samples": 3000}) for i in range(2)]
    old = [_lrec(20, rate=20, latency=lat, failure_rate=0.0)]
    a, b = build_sheet(new + old)
    assert (a.latency_samples, a.failure_trials, a.failure_events) == (3000, 6000, 0)
    assert a.quantiles_ms == {0.5: 5, 0.9: 8, 0.95: 9, 0.99: 12, 0.999: 20, 1.0: 30}
    assert (b.latency_samples, b.failure_trials, b.failure_events) == (None, None, None)
    checks = check_rows([a, b], [Objective(metric="availability", min=0.999),
                                 Objective(metric="p95_ms", max=50)])
    assert [c.outcome for c in checks] == ["met", "met", "undecided", "undecided"]
    assert checks[2].decision.need == "sample size not recorded (1 measured)"
    # A stage whose records measured no failure rate: the sheet's rate is failed repeats / repeats.
    c = build_sheet([rec("data", "scale", 1, rate=1, repeat=i) for i in range(3)])[0]
    assert (c.failure_trials, c.failure_events) == (3, 0)


def test_verdict_never_rests_on_undecided_or_unmeasured_checks() -> None:
    lat = Latency(p50_ms=5, p90_ms=8, p95_ms=9, p99_ms=12, p999_ms=20, max_ms=30)
    recs = [_lrec(lvl, rate=lvl, latency=lat, failure_rate=0.0, extras={"samples": n})
            for lvl, n in ((10, 3000), (20, 3000), (100, 1180))]
    goal = StageGoal(stage="serve", objectives=[
        Objective(metric="p95_ms", max=50, label="p95 ≤ 50 ms"),
        Objective(metric="availability", min=0.999, label="availability ≥ 99.9%"),
        Objective(metric="quality:f1", min=0.5, label="F1 ≥ 0.5")])
    v = judge([goal], build_sheet(recs), cores=2, memory_bytes=M.memory_bytes)
    s = v.stages[0]
    # F1 was never measured: no level is met, whatever latency and availability did.
    assert s.passed_up_to is None and s.outcome == "undecided" and v.outcome == "undecided"
    assert [gap_text(g) for g in s.not_measured] == ["F1 ≥ 0.5"]
    goal2 = StageGoal(stage="serve", objectives=goal.objectives[:2])
    v2 = judge([goal2], build_sheet(recs), cores=2, memory_bytes=M.memory_bytes)
    s2 = v2.stages[0]
    assert s2.passed_up_to == 2.0 and s2.miss is None and v2.outcome == "undecided"
    assert decided_text(s2) == (
        "meets p95 ≤ 50 ms, availability ≥ 99.9% up to 2×, decided at 95%")
    # What decides it is data: 2,995 requests without a failure, 1,180 measured.
    (need,) = s2.needs
    assert (need.samples, need.measured, need.unit) == (2995, 1180, "requests")
    assert open_text(s2) == ("undecided at 10×: availability ≥ 99.9% needs 2,995 requests "
                             "(measured 1,180)")
    assert headline(v2) == (
        "no stage misses its objectives at the levels measured; none decided met at every "
        "level; serve met to 2×, undecided at 10×: availability ≥ 99.9% needs 2,995 requests "
        "(measured 1,180)")


def test_a_stage_without_objectives_is_measured_not_judged() -> None:
    recs = [_lrec(lvl, rate=lvl) for lvl in (1, 2)]
    v = judge([StageGoal(stage="serve", objectives=[])], build_sheet(recs), cores=2,
              memory_bytes=M.memory_bytes)
    s = v.stages[0]
    assert (s.outcome, decided_text(s), s.passed_up_to) == (
        "no objectives", "no objectives to judge (measured only)", None)
    assert v.outcome == "met"
    assert headline(v) == ("no stage misses its objectives at the levels measured; none "
                           "decided met at every level")


def test_the_decided_line_says_how_each_objective_was_decided() -> None:
    lat = Latency(p50_ms=5, p90_ms=8, p95_ms=9, p99_ms=12, p999_ms=20, max_ms=30)
    recs = [_lrec(lvl, repeat=i, rate=lvl * (1 + i / 10), latency=lat, failure_rate=0.0,
                  quality={"f1": 0.8}, extras={"samples": 1000})
            for lvl in (10, 20) for i in range(2)]
    goal = StageGoal(stage="serve", objectives=[
        Objective(metric="p95_ms", max=50, label="p95 ≤ 50 ms"),
        Objective(metric="rate", min=5, label="rate ≥ 5/s"),
        Objective(metric="quality:f1", min=0.5, label="F1 ≥ 0.5")])
    s = judge([goal], build_sheet(recs), cores=2, memory_bytes=M.memory_bytes).stages[0]
    assert s.outcome == "met"
    assert decided_text(s) == (
        "meets p95 ≤ 50 ms, rate ≥ 5/s, F1 ≥ 0.5 up to 2× (p95 ≤ 50 ms decided at 95%; "
        "rate ≥ 5/s over 2 repeats; F1 ≥ 0.5 as measured points)")


def test_the_binomial_and_beta_quantiles_are_scipy_stats_own() -> None:
    # decide.py calls the ufuncs behind scipy.stats.binom / beta (its import costs every load
    # process ~1 s of CPU): the same numbers, bit for bit, edges of the support included.
    import numpy as np
    from scipy.stats import beta, binom

    from scalelab.lab.core import decide as d

    for n in (1, 2, 7, 59, 230, 459, 2995, 65536):
        for p in (0.001, 0.05, 0.5, 0.95, 0.999):
            ks = np.array([-1, 0, 1, n // 3, n - 1, n, n + 1], dtype=float)
            assert np.array_equal(d._bin_cdf(ks, np.full(len(ks), n), p), binom.cdf(ks, n, p))
            for q in (0.025, 0.05, 0.5, 0.95, 0.975):
                assert d._bin_ppf(q, n, p) == int(binom.ppf(q, n, p))
            for k in {1, max(n // 2, 1), n}:  # Clopper-Pearson asks for k >= 1
                assert d._beta_quantile(p, k, n - k + 1) == float(beta.ppf(p, k, n - k + 1))


def test_a_load_process_does_not_import_scipy_stats() -> None:
    import subprocess
    import sys

    code = ("import sys, scalelab.cli._load_requests, scalelab.lab.load.http.generator; "
            "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": ":".join(sys.path)}).stdout
    assert out.strip() == "[]"
