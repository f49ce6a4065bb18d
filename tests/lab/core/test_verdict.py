"""Sheet, objectives and verdict on hand-made records with known answers."""

import pytest

from recordkit import M, rec
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.limits import infer_limits, oversubscription
from scalelab.lab.core.objectives import Objective, check_rows, efficiency, first_miss
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import StageGoal, curve_prediction, judge
from scalelab.lab.diagnose.stages import serve, train
from scalelab.lab.report.verdict_text import decided_text, headline, tightest_text


def test_sheet_medians_and_multiples() -> None:
    recs = [
        rec("data", "scale", 1, repeat=0, rate=100.0),
        rec("data", "scale", 1, repeat=1, rate=120.0),
        rec("data", "scale", 1, repeat=2, rate=90.0),
        rec("data", "scale", 5, rate=400.0),
    ]
    sheet = build_sheet(recs)
    assert [(r.level, r.multiple, r.repeats, r.rate, r.rate_min, r.rate_max) for r in sheet] == [
        (1.0, 1.0, 3, 100.0, 90.0, 120.0),
        (5.0, 5.0, 1, 400.0, 400.0, 400.0),
    ]


def test_objective_validation_and_labels() -> None:
    with pytest.raises(BadInputError, match="unknown objective metric"):
        Objective(metric="p96", max=1)
    with pytest.raises(BadInputError, match="exactly one"):
        Objective(metric="rate", min=1, max=2)
    assert Objective(metric="p95_ms", max=50).label == "p95_ms ≤ 50"
    assert Objective(metric="rate", min=10).margin(12) == pytest.approx(0.2)
    # Availability headroom is the error budget left: 99.95% against 99.9% uses half of it.
    assert Objective(metric="availability", min=0.999).margin(0.9995) == pytest.approx(0.5)


def test_efficiency_is_relative_to_the_smallest_level() -> None:
    sheet = build_sheet(
        [
            rec("train", "workers", 1, rate=100),
            rec("train", "workers", 2, rate=150),
            rec("train", "workers", 4, rate=160),
        ]
    )
    assert efficiency(sheet) == {1.0: 1.0, 2.0: 0.75, 4.0: 0.4}
    checks = check_rows(sheet, [Objective(metric="efficiency", min=0.7)])
    miss = first_miss(checks)
    assert miss is not None and miss.level == 4.0 and miss.value == pytest.approx(0.4)


def test_serving_verdict_names_queue_and_batching_gain(serve_records: list[Record]) -> None:
    sheet = build_sheet(serve_records)
    goal = StageGoal(
        stage="serve",
        objectives=[Objective(metric="p95_ms", max=50)],
        baseline_series="batching=off",
        target_multiple=10,
        advisor=serve.advise,
    )
    v = judge([goal], sheet, cores=2, memory_bytes=M.memory_bytes)
    assert v.first is not None and v.first.stage == "serve"
    assert v.first.miss is not None and v.first.miss.multiple == 5.0
    assert v.first.passed_up_to == 2.0
    assert v.first.limiting[0].resource == "queue"
    assert "offered 500/s, served 141/s (28%)" in v.first.limiting[0].detail
    # Batching holds p95 ≤ 50 up to 250 req/s vs 100 without; the 10× peak is 500 req/s.
    assert "from 100 to 250 requests/s" in v.first.predicted
    assert "2 replica(s)" in v.first.intervention
    assert headline(v).startswith("serve misses first: p95_ms ≤ 50 fails at 5×")


def test_first_stage_to_miss_wins_and_headroom_is_reported(serve_records: list[Record]) -> None:
    recs = serve_records + [rec("data", "scale", s, rate=1000.0 * s) for s in (1, 2, 5, 10)]
    recs += [
        rec("train", "workers", n, rate=r, extras={"comm_share": c})
        for n, r, c in ((1, 100, 0.0), (2, 120, 0.45), (4, 110, 0.6))
    ]
    goals = [
        StageGoal(stage="data", objectives=[Objective(metric="rate", min=500)]),
        StageGoal(
            stage="train", objectives=[Objective(metric="efficiency", min=0.7)],
            advisor=train.advise,
        ),
        StageGoal(
            stage="serve",
            objectives=[Objective(metric="p95_ms", max=50)],
            baseline_series="batching=off",
        ),
        StageGoal(stage="model", objectives=[Objective(metric="p95_ms", max=5)]),
    ]
    v = judge(goals, build_sheet(recs), cores=2, memory_bytes=M.memory_bytes)
    # train misses at 2× (efficiency 0.6), serving at 5×, data never: train is first.
    assert v.first is not None and v.first.stage == "train"
    assert v.first.miss is not None and v.first.miss.multiple == 2.0
    # 4 workers on 2 cores: the ceiling is named first, then what was measured.
    assert [e.resource for e in v.first.limiting[:2]] == ["cores", "communication"]
    assert "fix communication" in v.first.intervention
    data = next(s for s in v.stages if s.stage == "data")
    assert data.miss is None and data.passed_up_to == 10.0
    assert tightest_text(data) == "rate ≥ 500: 1k at 1× (100% headroom)"
    model = next(s for s in v.stages if s.stage == "model")
    assert not model.measured


def test_no_miss_summary_reports_reach() -> None:
    sheet = build_sheet([rec("data", "scale", s, rate=1000.0) for s in (1, 2)])
    v = judge(
        [StageGoal(stage="data", objectives=[Objective(metric="rate", min=10)])],
        sheet,
        cores=2,
        memory_bytes=M.memory_bytes,
    )
    assert v.first is None
    assert headline(v) == (
        "no stage misses its objectives at the levels measured; decided met: data to 2×; "
        "least headroom — data: rate ≥ 10: 1k at 1× (9900% headroom)"
    )
    assert v.outcome == "met"
    assert decided_text(v.stages[0]) == "meets rate ≥ 10 up to 2×, as measured points"


def test_cpu_saturation_is_cited_with_numbers() -> None:
    sheet = build_sheet(
        [
            rec("train", "workers", n, rate=r, extras={"cpu_busy_cores": b})
            for n, r, b in ((1, 100, 1.0), (2, 190, 1.97), (4, 185, 1.99))
        ]
    )
    v = judge(
        [
            StageGoal(
                stage="train", objectives=[Objective(metric="efficiency", min=0.8)],
                advisor=train.advise,
            )
        ],
        sheet,
        cores=2,
        memory_bytes=M.memory_bytes,
    )
    s = v.stages[0]
    assert s.miss is not None and s.miss.level == 4.0
    assert [e.resource for e in s.limiting[:2]] == ["cores", "cpu"]
    assert s.limiting[1].detail == "1.99 of 2 cores busy at workers=4"
    assert "cores are saturated" in s.intervention


def test_the_core_count_is_named_and_not_extrapolated_through() -> None:
    # A job with a 20% serial phase over 1, 2, 4, 8 processes on 2 cores: Amdahl up to the
    # cores, then the processes take turns (the rate stays at the 2-core value).
    amdahl = {1: 100.0, 2: 100.0 / (0.2 + 0.8 / 2)}
    rows = build_sheet([rec("job", "processes", n, rate=amdahl.get(n, amdahl[2]))
                        for n in (1, 2, 4, 8)])
    lim = infer_limits(rows, cores=2, memory_bytes=M.memory_bytes)
    assert lim[0].resource == "cores"
    assert lim[0].detail == ("8 processes on 2 cores: oversubscribed ×4 (levels 4, 8 exceed the "
                             "cores; what they measure is sharing, not scaling)")
    # Karp–Flatt only within the cores: e = (1/1.667 − 1/2)/(1 − 1/2) = 0.2 at 2.
    assert lim[1].resource == "serial fraction" and "e=0.20 at 2" in lim[1].detail
    assert "at 4" not in lim[1].detail
    assert curve_prediction(rows, cores=2) == (
        "the ceiling is the machine's 2 cores (8 processes on 2 cores: oversubscribed ×4): "
        "167 units/s measured at processes=2; no fit is extrapolated past the cores, where "
        "more processes only take turns: add cores or machines to grow")
    # Without the core count (or within it) the curve is read as before.
    assert "oversubscribed" not in curve_prediction(rows)
    v = judge([StageGoal(stage="job", objectives=[Objective(metric="efficiency", min=0.7)])],
              rows, cores=2, memory_bytes=M.memory_bytes)
    assert v.stages[0].intervention.startswith("cores: run no more workers, threads or processes")
    one = infer_limits(build_sheet([rec("job", "workers", n, rate=100.0) for n in (1, 2, 4)]),
                       cores=2, memory_bytes=M.memory_bytes)
    assert one[0].detail == ("4 workers on 2 cores: oversubscribed ×2 (what it measures is "
                             "sharing, not scaling)")
    assert oversubscription(rows, 8) is None


def test_a_level_is_a_curve_point_only_when_every_record_of_it_is_one() -> None:
    """Record.purpose reaches the sheet: a level measured only for the picture is a curve
    point; one that also has a record measured to decide it is a decision."""
    recs = [rec("serve", "rate", 10, rate=10, p95=5.0, purpose="curve"),
            rec("serve", "rate", 50, rate=50, p95=5.0, purpose="curve"),
            rec("serve", "rate", 50, rate=50, p95=5.0, repeat=1),
            rec("serve", "rate", 100, rate=100, p95=5.0)]
    assert [r.purpose for r in build_sheet(recs)] == ["curve", "decision", "decision"]


def test_a_target_decided_by_the_search_says_so_with_its_assumption() -> None:
    """A decision record the serve stage wrote from its capacity search's steps carries
    `decided_by`: the verdict and its long text say which steps decided and what that assumes."""
    from scalelab.lab.report.verdict_text import stage_head

    said = {"search": "batching=off capacity", "rate": 520.0, "target_rate": 500.0,
            "steps": [520.0, 640.0], "assumption": "latency does not fall as load rises"}
    recs = [rec("serve", "rate", 50, rate=50, p95=5.0, purpose="curve"),
            rec("serve", "rate", 500, rate=500, p95=5.0, extras={"decided_by": said})]
    goal = StageGoal(stage="serve", objectives=[Objective(metric="p95_ms", max=50)],
                     target_multiple=10)
    s = judge([goal], build_sheet(recs), cores=2, memory_bytes=M.memory_bytes).stages[0]
    expected = ("at 10×: decided by batching=off capacity's steps at 520, 640/s (target 500/s); "
                "assumes latency does not fall as load rises")
    assert s.decided_by == (expected,)
    assert f"  {expected}" in stage_head(s)
