"""The serve stage's target sized to what its share pays (pure rules, exact numbers): a later
chunk sends the largest count of requests the share pays at the measured rate (a p99's 299,
not 99.9% availability's 2,995), the level stops when the share pays none and hands the time
on, and the first screen names the open check with the budget that would decide it."""

from pathlib import Path

import numpy as np
import pytest

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record, make_record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.units import parse_duration
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.diagnose.commands import LoadRun
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.schema import Prices
from scalelab.lab.diagnose.sizing import NEED_MARGIN, UNPAID, pending
from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.stages.serve import STAGE, size_rate
from scalelab.lab.diagnose.steps import Step, StepResult
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.report.screen import RunBudget, need_note

OBJECTIVES = [Objective(metric="p95_ms", max=50.0, label="p95 ≤ 50 ms"),
              Objective(metric="p99_ms", max=200.0, label="p99 ≤ 200 ms"),
              Objective(metric="availability", min=0.999, label="availability ≥ 99.9%")]
RATE = 40.0
"""Requests/s offered at the level (the demo's 1× rate: 80 requests in a 2 s first chunk)."""
START_S = 2.5
"""A serve chunk's step start-up and warm-up beside its window (STEP_START_S + WARMUP_S)."""


def _chunk_record(n: int, window_s: float) -> Record:
    h = LatencyHistogram()
    h.record_us(np.full(n, 8000))  # every request 8 ms: p95 and p99 met once counted
    return make_record(experiment="e", stage="serve", variable="rate", level=RATE,
                       wall_s=window_s, rate=n / window_s, failures=0, failure_rate=0.0,
                       latency=h.percentiles().latency(), histograms={"latency": h.encode()},
                       extras={"samples": n, "successes": n}, series="batching=off")


class Server:
    """Chunks at RATE requests/s on a fake clock, each paying START_S beside its window (the
    first one's is its part of the step over every level, lent to the level)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.asked: list[float] = []

    def __call__(self, seconds: float, index: int) -> Record:
        self.asked.append(seconds)
        self.now += seconds + START_S
        return _chunk_record(round(seconds * RATE), seconds)


def test_a_share_that_pays_the_p99_but_not_availability_stops_unpaid() -> None:
    """30 s: the first chunk (80 requests in 2 s, 4.5 s with its start) decides the p95 (59)
    and leaves 23 s after the next chunk's 2.5 s start: 2,915 more requests for 99.9%
    availability (80.2 s with the margin) are not paid, the p99's 219 more (6.02 s) are. The
    next chunk asks 6.02 s, gets 241 (321 in all: the p99 decided met) and the level stops
    with availability open and ~14.5 s of its share handed on."""
    server = Server()
    got = size_rate(server, OBJECTIVES, first_s=2.0, share_s=30.0, clock=lambda: server.now)
    assert got is not None
    assert server.asked == [2.0, pytest.approx(219 / RATE * NEED_MARGIN)]
    sizing = got.extras["sizing"]
    assert (sizing["chunks"], sizing["samples"], sizing["stopped"]) == (2, 321, UNPAID)
    assert sizing["spent_s"] == pytest.approx(2.0 + 219 / RATE * NEED_MARGIN + 2 * START_S,
                                              abs=1e-3)
    assert [c.objective.label for c in pending(got, OBJECTIVES)] == ["availability ≥ 99.9%"]
    # the first screen names it with the budget that would pay it: 2,674 more requests at
    # the 40/s measured (66.9 s), all of any extra second going to serve: 260 + 66.9 -> 5m30s
    verdict = judge([StageGoal(stage="serve", objectives=OBJECTIVES,
                               baseline_series="batching=off", target_multiple=1.0)],
                    build_sheet([got.model_copy(update={"purpose": "decision"})]),
                    cores=2, memory_bytes=8 * 2**30)
    stage = verdict.stages[0]
    assert stage.outcome == "undecided"
    assert need_note("serve", stage.needs, budget=RunBudget(total_s=260.0,
                                                            part={"serve": 1.0})) == (
        "serve: availability ≥ 99.9% at 1× needs 2,995 requests: 74.9 s at 40 req/s; "
        "about --budget 5m30s would pay it")


def test_a_share_that_pays_availability_sizes_to_it() -> None:
    """100 s: 2,915 more requests (80.2 s with the margin) fit in the 93 s left."""
    server = Server()
    got = size_rate(server, OBJECTIVES, first_s=2.0, share_s=100.0, clock=lambda: server.now)
    assert got is not None
    assert server.asked == [2.0, pytest.approx(2915 / RATE * NEED_MARGIN)]
    assert got.extras["sizing"]["stopped"] == "decided"
    assert got.extras["samples"] == 3287


def test_a_users_endpoint_level_is_sized_to_what_its_share_pays(tmp_path: Path) -> None:
    """`stages.serve.url`: each level's chunks are `load run` steps (answered here at 40
    requests/s, instantly); a 30 s share pays the p99's 219 more requests (6.02 s), not
    availability's 2,915 (80.2 s): two steps, the second 6.02 s, stopped unpaid."""
    asked: list[str] = []

    def run(step: Step) -> StepResult:
        cmd = step.command
        assert isinstance(cmd, LoadRun)
        asked.append(cmd.duration)
        n = round(parse_duration(cmd.duration) * RATE)
        return StepResult(step=step, ok=True, returncode=0, wall_s=0.0,
                          records=[_chunk_record(n, parse_duration(cmd.duration))])

    def fail(step: Step, why: str) -> StepResult:
        raise AssertionError(why)

    kept: list[Record] = []
    ctx = Context(work=tmp_path, logs=tmp_path, repeats=1, prices=Prices(), settings={},
                  run=run, fail=fail, keep=kept.extend, shares={"serve": 30.0})
    s = STAGE.of(load_config(None, "default")).model_copy(update={
        "url": "http://127.0.0.1:9/v2/models/m/infer", "levels": [1.0], "base_rate": RATE,
        "duration": "2s", "capacity": False})
    STAGE.run(s, ctx)
    assert asked == ["2s", f"{219 / RATE * NEED_MARGIN:.3g}s"]
    assert [(r.extras["samples"], r.extras["sizing"]["stopped"]) for r in kept] == [
        (321, UNPAID)]
