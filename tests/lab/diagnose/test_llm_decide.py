"""The llm stage's target decided within its share (pure rules, exact numbers): a later chunk
is sized to the largest count of samples the share pays at the rate measured (a p95's 59, not
99% availability's 299), the level stops when its share pays none, the target is paid before
the bisection and the curve points, and the stage's minimum counts the chunk its p95s need."""

import numpy as np
import pytest

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record, make_record
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.sizing import NEED_MARGIN, UNPAID, paid_need, pending, size_level
from scalelab.lab.diagnose.stages.llm import LlmStage
from scalelab.lab.diagnose.stages.llm_sizing import (
    curve_fit,
    decide_chunk_s,
    level_share,
    probe_pays,
    target_concurrency,
)
from scalelab.lab.load.histogram import LatencyHistogram

TTFT = Objective(metric="p95_ms", max=2000.0, label="TTFT p95 ≤ 2 s")
AVAILABILITY = Objective(metric="availability", min=0.99, label="availability ≥ 99%")
RATE = 5.0
"""Requests/s the fake engine delivers (the demo's 10 streams deliver ~5.35 on 2 quiet cores)."""


def _chunk_record(n: int, window_s: float) -> Record:
    h = LatencyHistogram()
    h.record_us(np.full(n, 100_000))  # every TTFT 100 ms: a p95 decided met at 59
    return make_record(experiment="e", stage="llm", variable="concurrency", level=10.0,
                       wall_s=window_s, rate=n / window_s, failures=0, failure_rate=0.0,
                       latency=h.percentiles().latency(), histograms={"latency": h.encode()},
                       extras={"samples": n, "successes": n})


class Engine:
    """Chunks at RATE requests/s on a fake clock: the first counts 10 requests (2 s), later
    ones run their asked window; each pays 1 s of start-up beside its window."""

    def __init__(self) -> None:
        self.now = 0.0
        self.asked: list[float] = []

    def __call__(self, seconds: float, index: int) -> Record:
        self.asked.append(seconds)
        n, window = (10, 2.0) if index == 0 else (round(seconds * RATE), seconds)
        self.now += window + 1.0
        return _chunk_record(n, window)


def _size(share_s: float, *, paid_only: bool) -> tuple[Record, Engine]:
    engine = Engine()
    got = size_level(engine, [TTFT, AVAILABILITY], first_s=3.0, share_s=share_s,
                     clock=lambda: engine.now, window=lambda r, asked: r.wall_s or asked,
                     overhead_s=2.5, paid_only=paid_only)
    assert got is not None
    return got, engine


def test_the_share_pays_the_largest_count_it_can() -> None:
    """45 requests in 8.4 s (5.357/s): 20 s left pay the 14 more a p95 needs (2.87 s with the
    margin), not the 254 more of 99% availability (52.2 s); 60 s pay both; 2 s neither."""
    needs = [59, 59, 299]
    assert paid_need(needs, have=45, measured_s=8.4, left_s=20.0) == 59
    assert paid_need(needs, have=45, measured_s=8.4, left_s=60.0) == 299
    assert paid_need(needs, have=45, measured_s=8.4, left_s=52.1) == 59  # 52.15 s needed
    assert paid_need(needs, have=45, measured_s=8.4, left_s=52.2) == 299
    assert paid_need(needs, have=45, measured_s=8.4, left_s=2.0) is None
    assert paid_need(needs, have=None, measured_s=0.0, left_s=60.0) is None


def test_a_target_decides_the_p95_its_share_pays_and_leaves_the_rest() -> None:
    """A 30 s share at 5 requests/s: the first chunk (10 requests in 2 s, 3 s with its start)
    leaves 24.5 s after the next chunk's 2.5 s start-up: 299 requests (63.6 s) are not paid,
    59 are: the next chunk asks (59 - 10) / 5 × 1.1 = 10.78 s, gets 54, and the level stops
    with its p95 decided met on 64 requests and the availability check left open, the
    ~12 s it could not pay with left to what comes after it."""
    got, engine = _size(30.0, paid_only=True)
    assert engine.asked == [3.0, pytest.approx(49 / RATE * NEED_MARGIN)]
    sizing = got.extras["sizing"]
    assert (sizing["chunks"], sizing["samples"], sizing["stopped"]) == (2, 64, UNPAID)
    assert [c.objective.label for c in pending(got, [TTFT, AVAILABILITY])] == [
        "availability ≥ 99%"]
    assert sizing["spent_s"] == pytest.approx(3.0 + 49 / RATE * NEED_MARGIN + 1.0)
    # sized to the largest count instead, the same share buys the p95 too but spends it all
    whole, chased = _size(30.0, paid_only=False)
    assert chased.asked == [3.0, pytest.approx(24.5)]
    assert whole.extras["sizing"]["stopped"] == "time share spent"


def test_a_share_that_pays_the_availability_count_sizes_to_it() -> None:
    """100 s at 5/s: 289 more requests (63.58 s with the margin) fit in the 94.5 s left."""
    got, engine = _size(100.0, paid_only=True)
    assert engine.asked == [3.0, pytest.approx(289 / RATE * NEED_MARGIN)]
    assert got.extras["sizing"]["stopped"] == "decided" and got.extras["samples"] == 328


def test_the_target_is_paid_before_the_bisection() -> None:
    assert level_share(30.0, repeats_left=1, probes_left=3, target=True) == 30.0
    assert level_share(30.0, repeats_left=1, probes_left=2, target=False) == 15.0
    assert level_share(30.0, repeats_left=2, probes_left=3, target=True) == 15.0


def test_a_bisection_level_starts_only_where_its_part_pays_a_chunk() -> None:
    """A first chunk is 2.5 s start-up and 4 s of `requests` (quiet): 6.5 s times the pace."""
    assert probe_pays(6.5, 1.0) and probe_pays(10.79, 1.66)
    assert not probe_pays(5.0, 1.66) and not probe_pays(10.78, 1.66)


def test_curve_points_take_what_the_decision_left() -> None:
    """A curve step is 6 s and 4 s a level (quiet): [1, 2, 5] is 18 s."""
    assert curve_fit([5, 1, 2], 18.0, 1.0) == [1, 2, 5]
    assert curve_fit([1, 2, 5], 17.0, 1.0) == [1, 2]
    assert curve_fit([1, 2, 5], 17.0, 1.5) == [1]
    assert curve_fit([1, 2, 5], 9.9, 1.0) == []


def test_the_minimum_counts_the_chunk_the_target_p95s_need() -> None:
    """The demo's llm: 10 streams at its 10× target, 6 requests a level, so its first chunk
    counts 10; its p95s need 59: 49 more at the quiet 5.35/s with the margin and a chunk's
    2.5 s start. Its least is its minimum less the curve step (3 levels: 18 s)."""
    s = load_config(None, "default").stages.llm
    assert target_concurrency(s) == 10
    assert decide_chunk_s(s) == pytest.approx(2.5 + 49 / 5.35 * 1.1)
    assert decide_chunk_s(s.model_copy(update={"requests": 59})) == 0.0
    quick = s.model_copy(update={"levels": [1.0, 4.0]})  # --quick's levels: 4 streams
    assert target_concurrency(quick) == 4
    assert decide_chunk_s(quick) == pytest.approx(2.5 + 53 / 5.35 * 1.1)
    stage = LlmStage()
    assert stage.minimum_s(s, 1) - stage.least_s(s, 1) == 18.0
    assert stage.least_s(s, 1) == pytest.approx(13.0 + 8.0 + 2.5 + 49 / 5.35 * 1.1)
