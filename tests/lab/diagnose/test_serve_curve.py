"""The serve stage's capacity searches read back from hand-made records (pure: no processes):
undecided steps, step sizing by the rule, the replica curve and its advice, exact numbers."""

from pathlib import Path

import pytest

from recordkit import rec
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.diagnose.stages import serve, serve_sweep
from scalelab.lab.diagnose.stages import serve_curve as curve
from scalelab.lab.diagnose.stages.serve_curve import replica_advice, search_outcome
from scalelab.lab.load.capacity import CONFIRM_VARIABLE

P95 = Objective(metric="p95_ms", max=50)


def steps(series: str, *rows: tuple[float, str, int], **extras: object) -> list:
    return [rec("serve", "rate", lv, rate=lv, p95=10.0, series=series, input_volume=float(n),
                extras={"verdict": v, "requests_needed": 230, "slo": "p95<50ms", **extras})
            for lv, v, n in rows]


def confirm(series: str, level: float, verdict: str = "pass", wall_s: float = 10.0) -> list:
    """The confirmation run of a search's answer, as `load capacity` records it."""
    return [rec("serve", CONFIRM_VARIABLE, level, rate=level, p95=10.0, series=series,
                input_volume=level * wall_s, wall_s=wall_s,
                extras={"verdict": verdict, "rate_verdict": verdict, "capacity_confirm": True,
                        "valid_offer": True, "slo": "p95<50ms"})]


def test_undecided_steps_are_not_misses_and_say_what_the_rule_needs() -> None:
    # The last session's demo: 1 s steps at 40 and 80 req/s measure 40 and 80 requests, far
    # under the 230 a p95 step needs; they must not read as "no searched rate met".
    rows = build_sheet(steps("batching=off capacity", (40, "undecided-pass", 40),
                             (80, "undecided-pass", 80)))
    text = search_outcome("batching=off", rows).text()
    assert text == ("batching=off: the search was undecided (no step measured enough to "
                    "decide), 2 search steps; 2 undecided: 40 requests/s (40 requests, the p95 "
                    "rule needs 230), 80 requests/s (80 requests, the p95 rule needs 230)")
    assert "no searched rate met" not in text and "missed" not in text


def test_decided_pass_and_fail_around_an_undecided_step() -> None:
    search = steps("batching=on capacity", (40, "undecided-pass", 120), (80, "pass", 400),
                   (160, "fail", 300), (120, "undecided-fail", 900), capacity_confirm=False)
    rows = build_sheet(search + confirm("batching=on capacity", 80))
    o = search_outcome("batching=on", rows)
    assert (o.capacity_rps, o.fails_at) == (80, 160)
    assert o.text() == (
        "batching=on: capacity at the objective 80 requests/s measured, confirmed by 10 s at "
        "that rate (shorter than load capacity's 30 s, under diagnose's time budget) (fails at "
        "160), 4 search steps; 2 undecided: 40 requests/s (120 requests, the p95 rule needs "
        "230), 120 requests/s (900 requests: the interval still straddles the objective)")
    # Unconfirmed, the search's pass is no capacity: advice never divides by it.
    o = search_outcome("batching=on", build_sheet(search))
    assert (o.capacity_rps, o.searched_rps) == (None, 80)
    assert o.text().startswith("batching=on: the search passed 80 requests/s but no "
                               "confirmation run was made: no confirmed capacity")
    # A search that does not confirm (`load llm capacity`: no `capacity_confirm` in its
    # records) keeps its decided pass.
    llm = steps("c capacity", (4, "pass", 400), (8, "fail", 300))
    o = search_outcome("c", build_sheet(llm))
    assert (o.capacity_rps, o.confirming) == (4, False)
    assert o.text() == ("c: capacity at the objective 4 requests/s measured (fails at 8), 2 "
                        "search steps")
    # A failed confirmation is a fail above the confirmed rate below it.
    o = search_outcome("batching=on", build_sheet(
        search + confirm("batching=on capacity", 80, "fail") + steps(
            "batching=on capacity", (60, "pass", 400)) + confirm("batching=on capacity", 60)))
    assert (o.capacity_rps, o.fails_at, o.searched_rps, o.confirmations) == (60, 80, 80, 2)
    only_fails = build_sheet(steps("x capacity", (40, "fail", 300), (20, "fail", 250)))
    assert search_outcome("x", only_fails).text() == (
        "x: every decided step missed the objective (the lowest at 20 requests/s), 2 search steps")


def test_steps_are_sized_by_the_rule() -> None:
    # Zero failures in n requests: the Clopper-Pearson upper bound 1 - 0.025^(1/n) <= 0.1%
    # first at n = 3688 (ln 0.025 / ln 0.999 = 3687.1).
    assert curve.budget_requests(0.001) == 3688
    avail = Objective(metric="availability", min=0.999)
    assert curve.search_requests([P95, avail], availability=False) == 230
    assert curve.search_requests([P95, avail], availability=True) == 3688
    assert curve.search_requests([Objective(metric="p99_ms", max=200)], availability=False) == 1164
    # 230 × 1.25 / 40 req/s = 7.1875 s, rounded up to the tenth; a long floor wins.
    assert curve.step_seconds(230, 40.0, 1.0) == 7.2
    assert curve.step_seconds(230, 400.0, 2.0) == 2.0


def test_two_replica_counts_give_one_efficiency_and_an_amdahl_count() -> None:
    # X1 = 300, X2 = 540: speedup 1.8, Karp–Flatt e = (1/1.8 - 1/2) / (1 - 1/2) = 1/9.
    # Amdahl through both: X(N) = 300 N / (1 + (N - 1)/9): X(4) = 900, X(5) = 1038.5.
    adv = replica_advice({1: 300.0, 2: 540.0}, {2: 330.0}, 1000.0, config="batching=on")
    assert adv is not None and (adv.replicas, adv.measured) == (5, False)
    assert adv.lines[0] == ("replicas of batching=on measured at the objective (1 torch thread "
                            "each): 1 → 300, 2 → 540 requests/s")
    assert adv.lines[1] == ("on 2 cores, 2 replicas × 1 thread hold 540 requests/s and 1 replica "
                            "× 2 threads 330 (horizontal is 1.64× vertical, measured)")
    assert adv.lines[2].startswith("two replica counts give one efficiency (0.90 at 2) and one "
                                   "Karp–Flatt serial fraction (0.111, exact through both")
    assert "cannot tell contention from coherency" in adv.lines[2]
    assert adv.lines[3] == ("5 replica(s) hold the peak of 1000 requests/s (1038 predicted, "
                            "extrapolated 2.5× beyond the 2 measured)")
    held = replica_advice({1: 300.0, 2: 540.0}, {}, 500.0, config="batching=on")
    assert held is not None and (held.replicas, held.measured) == (2, True)
    assert held.lines[-1] == "2 replica(s) hold the peak of 500 requests/s (540 measured at 2)"
    # Past the Amdahl ceiling X1 / e = 2700 no count helps.
    none = replica_advice({1: 300.0, 2: 540.0}, {}, 3000.0, config="batching=on")
    assert none is not None and none.replicas is None
    assert none.lines[-1].startswith("no replica count reaches the peak of 3000 requests/s on "
                                     "this curve (its ceiling is 2700)")


def test_three_or_more_counts_fit_the_usl() -> None:
    # Exact USL points, gamma 100, alpha 0.1, beta 0.02: the peak is at sqrt(0.9 / 0.02) = 6.708.
    def x(n: int) -> float:
        return 100 * n / (1 + 0.1 * (n - 1) + 0.02 * n * (n - 1))

    pts: dict[int, float | None] = {n: x(n) for n in (1, 2, 4, 8)}
    adv = replica_advice(pts, {}, 400.0, config="batching=on")
    assert adv is not None and adv.replicas is None
    assert adv.lines[1].startswith("the usl fit over 4 replica counts (chosen by AIC over "
                                   "linear and Amdahl) peaks at ≈6.71 replicas with 287.")
    assert replica_advice({}, {}, 400.0, config="x") is None
    one = replica_advice({1: 300.0, 2: None}, {2: None}, 1000.0, config="x")
    assert one is not None and one.replicas is None
    assert "1 → 300, 2 → undecided" in one.lines[0]
    assert one.lines[1] == ("on 2 cores, horizontal vs vertical is undecided (2 replicas: "
                            "undecided, 2 threads: undecided)")


def test_the_advisor_quotes_the_measured_replica_curve() -> None:
    recs = [rec("serve", "rate", lv, rate=lv, p95=5.0, series="batching=off")
            for lv in (40, 80, 400)]
    for n, cap in ((1, 300.0), (2, 540.0)):
        recs += steps(f"replicas={n} capacity", (cap, "pass", 2000), (cap * 1.1, "fail", 500),
                      replicated="batching=on") + confirm(f"replicas={n} capacity", cap)
    recs += steps("threads=2 capacity", (330.0, "pass", 2000), (363.0, "fail", 500)) + \
        confirm("threads=2 capacity", 330.0)
    goal = StageGoal(stage="serve", objectives=[P95], baseline_series="batching=off",
                     target_multiple=25, advisor=serve.advise)
    v = judge([goal], build_sheet(recs), cores=2, memory_bytes=2**34).stages[0]
    # 25 × 40 = 1000 requests/s: 5 replicas on the Amdahl curve through the two points.
    assert "run 5 replica(s) (read off the replica curve: extrapolated)" in v.intervention
    assert "linear in replicas" not in v.predicted
    assert "replicas of batching=on measured at the objective (1 torch thread each): " \
           "1 → 300, 2 → 540 requests/s" in v.predicted
    assert "horizontal is 1.64× vertical, measured" in v.predicted
    # Without a sweep the old estimate stays, and says it is not measured.
    bare = judge([goal], build_sheet(recs[:3]), cores=2, memory_bytes=2**34).stages[0]
    assert "linear in replicas from one replica, not measured: stages.serve.replicas " \
           "measures the curve" in bare.predicted


def test_sweep_shapes_stop_at_the_cores(tmp_path: Path) -> None:
    s = serve.ServeSettings(replicas=[4, 1, 2])
    got = [(x.series, x.processes, x.threads) for x in serve_sweep.sweep_shapes(s, cores=2)]
    assert got == [("replicas=1", 1, 1), ("replicas=2", 2, 1), ("threads=2", 1, 2)]
    no_threads = serve.ServeSettings(replicas=[1, 2], threads=False)
    assert [x.series for x in serve_sweep.sweep_shapes(no_threads, cores=8)] == ["replicas=1",
                                                                           "replicas=2"]
    for name in ("histogram_101.db", "counter_101.db", "gauge_livesum_202.db", "other.txt"):
        (tmp_path / name).write_bytes(b"")
    assert serve_sweep.worker_pids(tmp_path) == {101, 202}


@pytest.mark.parametrize("bad", [0.0, 1.0])
def test_budget_requests_rejects_a_budget_outside_0_1(bad: float) -> None:
    with pytest.raises(BadUsageError, match="capacity_availability: false"):
        curve.budget_requests(bad)


def test_a_falling_replica_curve_is_not_fitted() -> None:
    # The busy 2-core machine: 2 co-located replicas held less than 1 (the generator shares
    # the cores). No Amdahl count is read off such a curve.
    adv = replica_advice({1: 320.0, 2: 160.0}, {2: 320.0}, 400.0, config="batching=on")
    assert adv is not None and adv.replicas is None
    assert adv.lines[-1].startswith("capacity falls from 1 to 2 replicas (320 → 160 requests/s, "
                                    "measured): replicas on the same cores contend for them")
    assert "horizontal is 0.50× vertical, measured" in adv.lines[1]
    assert curve.sweep_start([80.0, 240.0, 160.0], 40.0) == 120.0
    assert curve.sweep_start([], 40.0) == 40.0 and curve.sweep_start([60.0], 40.0) == 40.0


def test_a_retried_rate_counts_the_verdict_the_search_counted() -> None:
    # 960 req/s: the first step passed but was invalid (generator lag), its retry failed; the
    # search counted the retry, so 960 is a fail and the capacity is 640.
    recs = steps("replicas=1 capacity", (640, "pass", 900), (960, "pass", 1450),
                 (960, "fail", 1438), rate_verdict=None)
    for r in recs:
        r.extras["rate_verdict"] = "fail" if r.level == 960 else "pass"
    o = search_outcome("replicas=1", build_sheet(recs + confirm("replicas=1 capacity", 640)))
    assert (o.capacity_rps, o.fails_at, o.steps) == (640, 960, 2)
