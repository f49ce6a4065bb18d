"""The serve stage decides its target first (issue #45): the baseline's target level is the
decision, the other levels curve points; a capacity search's step at or above the target's
rate that met every objective decides the target, saying so and what it assumes."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record, append_records, make_record
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.run import Runner
from scalelab.lab.diagnose.stages.serve import (
    ASSUMPTION,
    FirstChunks,
    SearchUsage,
    searched_decision,
    searched_usage,
)
from scalelab.lab.diagnose.stages.serve_search import search_path
from scalelab.lab.load.histogram import LatencyHistogram
from stagekit import run_serve_alone, stages_yaml

OBJECTIVES = [Objective(metric="p95_ms", max=50.0), Objective(metric="p99_ms", max=200.0),
              Objective(metric="availability", min=0.999)]


def _step(rate: float, n: int) -> Record:
    h = LatencyHistogram()
    h.record_us(np.full(n, 8000))
    return make_record(experiment="search", stage="load", variable="rate", level=rate,
                       wall_s=1.0, rate=float(n), failures=0, failure_rate=0.0,
                       latency=h.percentiles().latency(),
                       histograms={"latency": h.encode()},
                       extras={"samples": n, "successes": n,
                               "rate_verdict": "pass"}, series="batching=off capacity")


def test_a_search_step_above_the_target_rate_is_the_targets_decision(tmp_path: Path) -> None:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(stages_yaml({"serve": "{levels: [1]}"}))
    ctx = Runner(load_config(cfg, "default"), tmp_path / "out", "default").ctx
    first = FirstChunks(records={400.0: make_record(experiment="diag", stage="serve",
                                                    variable="rate", level=400.0)}, took_s=3.0)
    assert searched_decision(ctx, "batching=off", OBJECTIVES, 400.0, first, rep=0) is None
    path = search_path(ctx, "batching=off")
    path.parent.mkdir(parents=True, exist_ok=True)
    # 400/s: 1,000 requests cannot show 99.9%; 3,200/s: 4,000 requests, all under 50 ms
    append_records(path, [_step(400.0, 1000), _step(3200.0, 4000)])
    got = searched_decision(ctx, "batching=off", OBJECTIVES, 400.0, first, rep=0)
    assert got is not None and got.level == 3200.0 and got.stage == "serve"
    assert got.purpose == "decision" and got.experiment == "diag"
    assert got.series == "batching=off"
    assert got.extras["decided_by"] == {"search": "batching=off capacity", "rate": 3200.0,
                                        "target_rate": 400.0, "steps": [3200.0],
                                        "assumption": ASSUMPTION}
    assert searched_decision(ctx, "batching=off", OBJECTIVES, 4000.0, first, rep=0) is None
    # a search step carries no server CPU: without the reading around the search the row has
    # none ("not measured" on the first screen); with it, the verdict infers from it
    assert got.resources.cpu_busy_cores is None
    read = searched_decision(ctx, "batching=off", OBJECTIVES, 400.0, first, rep=0,
                             usage=SearchUsage(busy_cores=1.96))
    assert read is not None and read.resources.cpu_busy_cores == 1.96
    assert read.extras["search_server_busy_cores"] == 1.96
    # the confirmation at 1,600/s decides it where it is the lowest such step: the row joins
    # the baseline's variable, not the confirmation's (a series of its own read as 1×)
    path.unlink()
    conf = _step(1600.0, 16000).model_copy(update={"variable": "rate (confirmation)"})
    append_records(path, [_step(400.0, 1000), conf])
    got = searched_decision(ctx, "batching=off", OBJECTIVES, 400.0, first, rep=0)
    assert got is not None and (got.level, got.variable) == (1600.0, "rate")


def test_the_server_is_read_around_its_search() -> None:
    """A real process spinning on one core through a 0.4 s "search": its CPU seconds over
    the search's wall time, as psutil reads them around it (at most one core's worth; a
    sleeping one reads ~0)."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        proc = psutil.Process(spin.pid)
        c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        got = searched_usage(spin.pid, lambda: time.sleep(0.4))
        c1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        assert got is not None and 0.0 < got.busy_cores <= 1.1
        assert got.busy_cores == pytest.approx((c1 - c0) / (t1 - t0), rel=0.25)
        idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            time.sleep(0.3)
            quiet = searched_usage(idle.pid, lambda: time.sleep(0.5))
            assert quiet is not None and quiet.busy_cores < 0.05
        finally:
            idle.kill()
    finally:
        spin.kill()


def test_the_target_is_the_decision_and_the_other_levels_curve_points(tmp_path: Path) -> None:
    """Two levels on a small model, no search: 10× (the target) is sized as the decision,
    1× stays the one chunk of the step over both levels, labelled a curve point."""
    _, recs = run_serve_alone(tmp_path, "{base_rate: 20, levels: [1, 10], duration: 1s, "
                              "batching: ['off'], capacity: false, target_multiple: 10}")
    got = {(r.level, r.purpose) for r in recs}
    assert got == {(20.0, "curve"), (200.0, "decision")}
    target = next(r for r in recs if r.level == 200.0)
    assert target.extras["sizing"]["chunks"] >= 1
    assert "sizing" not in next(r for r in recs if r.level == 20.0).extras


def test_the_sweeps_time_is_scaled_by_this_runs_own_search() -> None:
    """Three shapes on 2 cores (replicas=1, replicas=2, threads=2), 12 s each on the quiet
    reference; a one-server search that took 34 s against its 17 s doubles them."""
    from scalelab.lab.diagnose.stages.serve import STAGE, ServeStage

    s = STAGE.of(load_config(None, "default"))
    assert ServeStage()._sweep_s(s, 2, []) == 36.0
    assert ServeStage()._sweep_s(s, 2, [34.0]) == 72.0
    assert ServeStage()._sweep_s(s, 2, [10.0]) == 36.0  # a fast search never shrinks it
    assert ServeStage()._sweep_s(s.model_copy(update={"capacity": False}), 2, [34.0]) == 0.0
