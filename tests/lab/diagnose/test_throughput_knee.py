"""The serving advice's bend in the throughput curve, on curves too short for Kneedle."""

from recordkit import rec
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.diagnose.stages.serve_advice import throughput_knee


def test_a_short_curve_that_stops_keeping_up_names_its_bend() -> None:
    # 40, 80, 160 offered and 40, 80, 100 served: too short for Kneedle's threshold, but
    # 160 is served at 62%, so the bend is after 80, the last level that kept up.
    rows = build_sheet([rec("locked", "rate", x, rate=y)
                        for x, y in ((40, 40), (80, 80), (160, 100))])
    assert throughput_knee(rows) == (
        "the throughput curve bends at 80 requests/s offered (80 served, measured): beyond it "
        "the served rate stops following the offered rate (160 offered, 100 served)")


def test_a_curve_that_keeps_up_has_no_bend() -> None:
    rows = build_sheet([rec("locked", "rate", x, rate=x * 0.97) for x in (40, 80, 160)])
    assert throughput_knee(rows).startswith("no knee in the throughput curve up to 160")
