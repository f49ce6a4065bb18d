"""Decide at the target first (issue #45): the target level measured to a decision, the first
miss found by bisection over the levels under it, and a capacity search's step at or above
the target's rate deciding it (pure functions, exact orders)."""

from collections.abc import Callable

import numpy as np
import pytest

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Latency, Record, make_record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.diagnose.sizing import (
    Outcome,
    bisection_steps,
    decide_target,
    level_outcome,
    search_decides,
    target_level,
)
from scalelab.lab.load.histogram import LatencyHistogram

LEVELS = [1.0, 2.0, 5.0, 10.0]


def _truth(misses_from: float | None, undecided: set[float] | None = None,
           asked: list[tuple[float, int]] | None = None) -> Callable[[float, int], Outcome]:
    def outcome(level: float, probes_left: int) -> Outcome:
        if asked is not None:
            asked.append((level, probes_left))
        if undecided and level in undecided:
            return "undecided"
        return "missed" if misses_from is not None and level >= misses_from else "met"
    return outcome


def test_a_target_that_holds_is_the_only_decision() -> None:
    d = decide_target(LEVELS, 10.0, _truth(None))
    assert d.order == [10.0] and d.holds and d.first_miss is None


def test_a_missed_target_bisects_for_the_first_miss() -> None:
    asked: list[tuple[float, int]] = []
    d = decide_target(LEVELS, 10.0, _truth(5.0, asked=asked))
    assert d.order == [10.0, 2.0, 5.0] and d.first_miss == 5.0 and not d.holds
    # the target is told 3 levels at most remain (itself and a bisection over three), 2× two
    assert asked == [(10.0, 3), (2.0, 2), (5.0, 1)]
    assert decide_target(LEVELS, 10.0, _truth(1.0)).order == [10.0, 2.0, 1.0]
    assert decide_target(LEVELS, 10.0, _truth(1.0)).first_miss == 1.0
    only_top = decide_target(LEVELS, 10.0, _truth(10.0))
    assert only_top.order == [10.0, 2.0, 5.0] and only_top.first_miss == 10.0


def test_an_undecided_level_leaves_the_bracket_open() -> None:
    d = decide_target(LEVELS, 10.0, _truth(5.0, undecided={2.0}))
    assert d.order == [10.0, 2.0] and d.first_miss is None
    assert d.outcomes == {10.0: "missed", 2.0: "undecided"}
    top = decide_target(LEVELS, 10.0, _truth(None, undecided={10.0}))
    assert top.order == [10.0] and not top.holds and top.first_miss is None


def test_the_target_level_is_the_highest_at_or_under_the_multiple() -> None:
    assert target_level([1.0, 4.0], 10.0) == 4.0  # --quick's llm levels stop under 10×
    assert target_level(LEVELS, 10.0) == 10.0
    assert target_level([1.0, 2.0, 5.0, 10.0, 20.0], 10.0) == 10.0
    assert target_level([2.0, 5.0], 1.0) == 2.0
    assert [bisection_steps(n) for n in (0, 1, 2, 3, 4, 7, 8)] == [0, 1, 2, 2, 3, 3, 4]


OBJECTIVES = [Objective(metric="p95_ms", max=50.0, label="p95 ≤ 50 ms"),
              Objective(metric="availability", min=0.999, label="availability ≥ 99.9%")]


def _step(rate: float, *, n: int, ms: float) -> Record:
    h = LatencyHistogram()
    h.record_us(np.full(n, int(ms * 1000)))
    return make_record(experiment="e", stage="serve", variable="rate", level=rate, wall_s=1.0,
                       rate=float(n), failures=0, failure_rate=0.0,
                       latency=h.percentiles().latency(),
                       histograms={"latency": h.encode()},
                       extras={"samples": n, "successes": n})


def test_a_search_step_at_or_above_the_target_rate_decides_it() -> None:
    steps = [_step(200.0, n=4000, ms=5.0), _step(400.0, n=1000, ms=5.0),
             _step(800.0, n=4000, ms=8.0), _step(1600.0, n=4000, ms=90.0)]
    assert [level_outcome(r, OBJECTIVES) for r in steps] == ["met", "undecided", "met",
                                                             "missed"]
    # 400/s itself is undecided (1,000 requests cannot show 99.9%); 800/s decides it
    got = search_decides(steps, OBJECTIVES, 400.0)
    assert got is not None and got.level == 800.0
    assert search_decides(steps, OBJECTIVES, 800.0) is steps[2]
    assert search_decides(steps, OBJECTIVES, 1000.0) is None  # only 1,600/s, missed
    assert search_decides(steps[:2], OBJECTIVES, 300.0) is None  # a met 200/s is below it


def test_a_sized_level_says_how_fast_it_gathered_samples() -> None:
    """What the budget that would decide an undecided check is read from: 1,180 requests in
    the chunks' 4 s of measured windows (5.5 s with their start-ups), so 2,995 need ~10.2 s
    at that pace."""
    from scalelab.lab.diagnose.sizing import Sizing

    z = Sizing(chunks=2, samples=1180, spent_s=5.5, share_s=4.5, stopped="time share spent",
               undecided=["availability ≥ 99.9%: 1,180 requests; 99.9% needs ≥ 2,995"],
               measured_s=4.0)
    assert z.as_dict()["samples_per_s"] == 295.0
    assert Sizing(chunks=1, samples=None, spent_s=4.0, share_s=4.5, stopped="decided",
                  undecided=[]).as_dict()["samples_per_s"] is None


def test_steps_at_or_above_the_target_rate_decide_it_together() -> None:
    """No 1 s step of ~1,000 requests shows 99.9% availability (2,995 needed); the steps at
    and above the target's rate that were not missed, merged, do: 1,000 + 1,000 + 1,200
    requests without a failure. A missed step above is left out; a met step below counts not."""
    steps = [_step(200.0, n=1000, ms=5.0), _step(400.0, n=1000, ms=5.0),
             _step(600.0, n=1000, ms=6.0), _step(700.0, n=1200, ms=7.0),
             _step(800.0, n=1200, ms=90.0)]
    got = search_decides(steps, OBJECTIVES, 400.0)
    assert got is not None and got.level == 400.0
    assert got.extras["merged_steps"] == [400.0, 600.0, 700.0]
    assert got.extras["samples"] == 3200 and got.failures == 0
    # from 600/s up only 2,200 requests: not enough together either
    assert search_decides(steps, OBJECTIVES, 600.0) is None


def test_a_step_counts_at_the_rate_it_sent() -> None:
    """A step asked for 800/s that sent 350/s (the generator fell behind) is no evidence for a
    400/s target; one flagged for generator lag that sent its rate counts in the merge."""
    short = _step(800.0, n=4000, ms=5.0)
    short = short.model_copy(update={"extras": {**short.extras, "sent_rps": 350.0}})
    assert search_decides([short], OBJECTIVES, 400.0) is None
    lagged = [_step(r, n=1100, ms=5.0) for r in (400.0, 800.0, 1000.0)]
    lagged[1] = lagged[1].model_copy(update={"ok": False, "extras": {
        **lagged[1].extras, "sent_rps": 805.0}})
    got = search_decides(lagged, OBJECTIVES, 400.0)
    assert got is not None and got.extras["merged_steps"] == [400.0, 800.0, 1000.0]


def test_the_next_chunk_pays_the_samples_still_needed() -> None:
    """100 requests in 2 s (50/s) with a p99 needing 299: 199 more take 3.98 s, with the
    margin 4.378 s; no count (a straddling bound) doubles; the share left caps both."""
    from scalelab.lab.diagnose.sizing import NEED_MARGIN, next_seconds

    assert next_seconds(have=100, need=299, measured_s=2.0, first_s=1.0, left_s=60.0) == \
        pytest.approx(199 / 50 * NEED_MARGIN)
    assert next_seconds(have=100, need=None, measured_s=2.0, first_s=1.0, left_s=60.0) == 2.0
    assert next_seconds(have=100, need=299, measured_s=2.0, first_s=1.0, left_s=3.0) == 3.0
    assert next_seconds(have=290, need=299, measured_s=2.0, first_s=1.0, left_s=60.0) == 1.0


def test_a_sized_level_puts_its_rate_where_the_sheet_reads_it() -> None:
    """The sheet keeps numeric extras only: the level's measured samples/s goes beside the
    sizing dict, and a Need reads it before the record's wall_s (a retrieval record's wall_s
    is its index build)."""
    from scalelab.lab.core.verdict import SAMPLES_RATE_KEY, _need
    from scalelab.lab.diagnose.sizing import pending

    rec = make_record(experiment="e", stage="s", variable="rate", level=10.0, wall_s=0.01,
                      latency=Latency(p50_ms=1.0, p95_ms=2.0, p99_ms=3.0, max_ms=4.0),
                      extras={"samples": 100, "samples_unit": "queries",
                              SAMPLES_RATE_KEY: 97.0})
    p99 = Objective(metric="p99_ms", max=20.0, label="p99 ≤ 20 ms")
    check = pending(rec, [p99])[0]
    need = _need(check, build_sheet([rec])[0])
    assert (need.samples, need.per_second) == (299, 97.0)
    assert need.seconds == pytest.approx(299 / 97.0)
