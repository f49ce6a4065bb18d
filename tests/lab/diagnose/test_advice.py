"""The stages' advisors on hand-made sheets with known answers (pure: no processes)."""

import pytest

from recordkit import rec
from scalelab.lab.core.objectives import Objective, slo_text
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import AdviceInput, StageGoal, best_capacity, curve_prediction, judge
from scalelab.lab.diagnose.stages import data, serve, serve_advice, serve_curve
from scalelab.lab.load.capacity import CONFIRM_VARIABLE


def test_capacity_slo_from_the_objectives() -> None:
    objs = [Objective(metric="p99_ms", max=200), Objective(metric="availability", min=0.999)]
    assert slo_text(objs) == "p99<200ms,avail>=99.9%"
    assert slo_text([Objective(metric="p95_ms", max=50)]) == "p95<50ms"
    assert slo_text([Objective(metric="availability", min=0.99)]) is None


def test_measured_capacity_and_knee_are_in_the_serving_prediction() -> None:
    recs = [rec("serve", "rate", lv, rate=sv, p95=p, series="batching=off")
            for lv, sv, p in ((10, 10, 5), (20, 20, 6), (40, 39, 8), (80, 41, 900))]
    recs += [rec("serve", "rate", lv, rate=lv, p95=p, series="batching=off capacity",
                 extras={"verdict": v})
             for lv, p, v in ((10, 5, "pass"), (40, 9, "pass"), (60, 300, "fail"),
                              (50, 40, "pass"), (55, 120, "fail"))]
    recs += [rec("serve", CONFIRM_VARIABLE, 50, rate=50, p95=30, series="batching=off capacity",
                 wall_s=10.0, extras={"verdict": "pass", "capacity_confirm": True})]
    goal = StageGoal(stage="serve", objectives=[Objective(metric="p95_ms", max=50)],
                     baseline_series="batching=off", target_multiple=8, advisor=serve.advise)
    v = judge([goal], build_sheet(recs), cores=2, memory_bytes=2**34).stages[0]
    assert "batching=off: capacity at the objective 50 requests/s measured, confirmed by 10 s " \
           "at that rate (shorter than load capacity's 30 s, under diagnose's time budget) " \
           "(fails at 55), 5 search steps" in v.predicted
    assert "the throughput curve bends at 40 requests/s offered (39 served, measured)" \
        in v.predicted
    # Capacity-search steps are not a candidate configuration of their own.
    assert "use batching=off capacity" not in v.intervention


def test_straight_throughput_has_no_knee_and_no_invented_peak() -> None:
    rows = build_sheet([rec("serve", "rate", lv, rate=lv, p95=5.0) for lv in (50, 100, 500)])
    assert serve_advice.throughput_knee(rows).startswith(
        "no knee in the throughput curve up to 500")
    text = curve_prediction(rows)
    assert "peak" not in text and "supports no ceiling" in text


def test_freshness_reach_is_an_extrapolation_and_says_so() -> None:
    # wall = 2 + 4 s per 1×: the 60 s window holds up to (60 - 2) / 4 = 14.5×.
    rows = build_sheet([rec("data", "scale", k, rate=1.0, wall_s=2 + 4 * k) for k in (1, 2, 5)])
    window = Objective(metric="wall_s", max=60, label="within 60 s")
    text = data.freshness_reach(rows, [window])
    assert text.startswith("within 60 s holds up to ≈14.5× the base volume")
    assert "extrapolated 2.9× beyond the last measured level" in text
    adv = data.advise(AdviceInput(goal=StageGoal(stage="data", objectives=[window]),
                                  base=rows, by_series={"": rows}, limits=[], miss=None))
    assert "partition" in adv.intervention and "14.5×" in adv.predicted


@pytest.mark.parametrize(("busy", "first"), [(1.95, "cpu"), (0.5, "none saturated")])
def test_custom_stage_limits_cite_measurements(busy: float, first: str) -> None:
    # A user's stage with a label that used to be parsed ("not cpu ...") and a measured signal.
    recs = [rec("etl", "workers", n, rate=100.0 * n, limiting_resource="not cpu 0.5",
                extras={"cpu_busy_cores": busy}) for n in (1, 2)]
    v = judge([StageGoal(stage="etl", objectives=[Objective(metric="rate", min=1)])],
              build_sheet(recs), cores=2, memory_bytes=2**34).stages[0]
    assert v.limiting[0].resource == first and "cores busy" in v.limiting[0].detail
    assert v.intervention and "limiting resource named above" not in v.intervention


def test_best_capacity_is_the_highest_passing_level_of_a_level_series() -> None:
    # batching=off holds p95 <= 50 up to 20, batching=on up to 80; the capacity search's series
    # (a higher passing rate, 500) is not a configuration and is left out.
    recs = [rec("serve", "rate", lv, rate=lv, p95=p, series="batching=off")
            for lv, p in ((10, 5), (20, 40), (40, 90), (80, 300))]
    recs += [rec("serve", "rate", lv, rate=lv, p95=p, series="batching=on")
             for lv, p in ((10, 6), (20, 7), (40, 20), (80, 45))]
    recs += [rec("serve", "rate", 500, rate=500, p95=10, series="batching=on capacity")]
    rows = build_sheet(recs)
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r.series, []).append(r)
    goal = StageGoal(stage="serve", objectives=[Objective(metric="p95_ms", max=50)],
                     baseline_series="batching=off", target_multiple=8)
    inp = AdviceInput(goal=goal, base=by["batching=off"], by_series=by, limits=[], miss=None)
    assert best_capacity(inp, skip_suffix=serve_curve.CAPACITY) == (80.0, 20, "batching=on", 80)
    assert best_capacity(inp)[2:] == ("batching=on capacity", 500)
