"""Where the serve stage's capacity searches start and what they need not measure again: from
the server's own level sweep (decided checks only), and which servers get a search at all."""

import json
from pathlib import Path

import pytest

from recordkit import rec
from scalelab.lab.core.objectives import Objective, check_rows
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.run import Runner
from scalelab.lab.diagnose.stages.serve import searched_settings
from scalelab.lab.diagnose.stages.serve_config import ServeSettings
from scalelab.lab.diagnose.stages.serve_curve import GridBounds, grid_bounds
from stagekit import run_serve_alone, stages_yaml

P95 = Objective(metric="p95_ms", max=50)
OBJECTIVES = [P95, Objective(metric="p99_ms", max=200),
              Objective(metric="availability", min=0.999)]


def _levels(*points: tuple[float, float, int]) -> list:
    """(rate, p95 ms, samples) levels of one server: p50 is half the p95, p99 twice it."""
    return build_sheet([rec("serve", "rate", lv, rate=lv, p95=p95, series="batching=off",
                            extras={"samples": n}) for lv, p95, n in points])


def test_the_search_starts_at_the_highest_met_level_below_the_lowest_missed() -> None:
    # 1,000 requests a level: p95 8 and 20 ms are met (the bound reads p99 16 and 40 ms),
    # 400 and 2,000 ms missed (the bound reads p50 200 ms, over 50).
    rows = _levels((50, 8, 1000), (100, 20, 1000), (250, 400, 1000), (500, 2000, 1000))
    assert grid_bounds(rows, OBJECTIVES, 50.0) == GridBounds(start=100, fails_at=250)


def test_undecided_levels_bound_nothing() -> None:
    # 100 requests at p95 45 ms: its upper bound reads p99 90 ms (over 50), its lower bound
    # p50 22.5 ms (under): undecided, so neither a start nor a known fail.
    rows = _levels((40, 8, 1000), (80, 45, 100), (200, 45, 100))
    assert grid_bounds(rows, OBJECTIVES, 40.0) == GridBounds(start=40, fails_at=None)
    # Nothing met at all: the base rate, and the lowest miss above it bounds the search.
    rows = _levels((40, 45, 100), (80, 400, 1000), (200, 2000, 1000))
    assert grid_bounds(rows, OBJECTIVES, 40.0) == GridBounds(start=40, fails_at=80)


def test_a_miss_below_the_highest_met_level_is_not_a_ceiling() -> None:
    # A miss at 80 below a met 200 (a stall of the machine): the search starts at 200 and
    # finds its ceiling by doubling, since no miss lies above it.
    rows = _levels((40, 8, 1000), (80, 400, 1000), (200, 20, 1000))
    assert grid_bounds(rows, OBJECTIVES, 40.0) == GridBounds(start=200, fails_at=None)


def test_without_a_latency_objective_the_search_starts_at_the_base_rate() -> None:
    rows = _levels((40, 8, 1000), (80, 400, 1000))
    assert grid_bounds(rows, [Objective(metric="availability", min=0.99)], 40.0) == \
        GridBounds(start=40, fails_at=None)


def test_the_replicated_setting_is_searched_by_the_sweep_where_it_is_that_server() -> None:
    s = ServeSettings(objectives=[{"metric": "p95_ms", "max": 50}])  # type: ignore[list-item]
    # 2 cores: 'threads=2' is one batching=on process with 2 threads, the levels' server.
    assert searched_settings(s, cores=2) == ["off"]
    # 1 core: 'replicas=1' is that server (1 process, 1 thread).
    assert searched_settings(s, cores=1) == ["off"]
    # 4 cores: the levels' server has 4 threads, which no shape of replicas [1, 2] has.
    assert searched_settings(s, cores=4) == ["off", "on"]
    no_threads = s.model_copy(update={"threads": False})
    assert searched_settings(no_threads, cores=2) == ["off", "on"]
    no_sweep = s.model_copy(update={"replicas": []})
    assert searched_settings(no_sweep, cores=2) == ["off", "on"]
    off_replicated = s.model_copy(update={"replicas_batching": "off"})
    assert searched_settings(off_replicated, cores=2) == ["on"]
    assert searched_settings(s.model_copy(update={"capacity": False}), cores=2) == []


@pytest.mark.slow
def test_the_stage_searches_from_its_levels(tmp_path: Path) -> None:
    """The reference server throttled to 40 ms a call (at most 25 requests/s without batching):
    its level at 20 requests/s meets p95 ≤ 400 ms (60 requests, constant arrivals: no queue)
    and its level at 30 misses it (the backlog grows 5 requests a second: ~200–800 ms in the
    window), both decided; its capacity search starts at 20 (not the base rate, 4) and is
    told 30 fails, so it never offers 30 or more. Slow: a p95 step needs 230 requests."""
    _, recs = run_serve_alone(tmp_path, "{base_rate: 4, levels: [5, 7.5], duration: 3s, "
                              "batching: ['off'], serial_ms: 40, capacity_max_steps: 2, "
                              "capacity_step: 0.5s, replicas: [], "
                              "objectives: [{metric: p95_ms, max: 400}]}")
    levels = [r for r in recs if r.series == "batching=off"]
    checks = check_rows(build_sheet(levels), [Objective(metric="p95_ms", max=400)])
    assert [(c.level, c.outcome) for c in checks] == [(20, "met"), (30, "missed")]
    steps = [r for r in recs if r.series == "batching=off capacity"]
    assert min(r.level for r in steps) == 20 and max(r.level for r in steps) < 30
    doc = json.loads((tmp_path / "out" / "logs" / "serve_batching_off_capacity.out").read_text())
    assert doc["fails_at"] == 30 and doc["steps"][0]["rate"] == 20


def test_the_sweep_starts_from_either_settings_search(tmp_path: Path) -> None:
    """The replica sweep's first search starts at half the best pass of any one-server search
    (batched or not) or the level sweep: the batching=off search's 4,800 requests/s, not the
    batching=on levels' 400, so replicas=1 is not doubled up from 200 (the demo's 6 doublings)."""
    from scalelab.lab.core.records import append_records
    from scalelab.lab.diagnose.stages.serve_curve import sweep_start
    from scalelab.lab.diagnose.stages.serve_search import search_path
    from scalelab.lab.diagnose.stages.serve_sweep import earlier_passes

    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(stages_yaml({"serve": "{levels: [1]}"}))
    ctx = Runner(load_config(cfg, "default"), tmp_path / "out", "default").ctx
    assert earlier_passes(ctx, 400.0) == [400.0]
    path = search_path(ctx, "batching=off")
    path.parent.mkdir(parents=True, exist_ok=True)
    append_records(path, [rec("serve", "rate", lv, rate=lv, series="batching=off capacity",
                              extras={"rate_verdict": v})
                          for lv, v in ((3200, "pass"), (6400, "fail"), (4800, "pass"))])
    assert sorted(earlier_passes(ctx, 400.0)) == [400.0, 3200.0, 4800.0]
    assert sweep_start(earlier_passes(ctx, 400.0), 40.0) == 2400.0
    assert sweep_start(earlier_passes(ctx, None), 40.0) == 2400.0


def test_a_search_is_given_what_is_left_of_its_stages_share(tmp_path: Path) -> None:
    # `load capacity --budget`: the stage's time left less the process's start-up, so the
    # search ends itself (records written, an answer it had no time to confirm said so)
    # before the stage's deadline would stop it and lose them; no --budget without a budget.
    import time

    from scalelab.lab.diagnose.schema import Prices
    from scalelab.lab.diagnose.stages.base import Context
    from scalelab.lab.diagnose.stages.serve_search import SEARCH_START_S, run_search
    from scalelab.lab.diagnose.steps import Step, StepResult

    ran: list[Step] = []

    def run(step: Step) -> StepResult:
        ran.append(step)
        return StepResult(step=step, ok=True, returncode=0, wall_s=0.0)

    s = ServeSettings(capacity=True, objectives=[{"metric": "p95_ms", "max": 50}])
    for deadline in (time.monotonic() + 100.0, None):
        ctx = Context(work=tmp_path, logs=tmp_path / "logs", repeats=1, prices=Prices(),
                      settings={}, run=run, fail=lambda step, why: pytest.fail(why),
                      deadline=deadline)
        run_search(s, ctx, stage="serve", series="x", url="http://127.0.0.1:1", repo=None,
                   data=None)
    with_budget, without = (step.command.to_argv() for step in ran)  # type: ignore[union-attr]
    given = float(with_budget[with_budget.index("--budget") + 1].removesuffix("s"))
    assert 100.0 - SEARCH_START_S - 5.0 < given <= 100.0 - SEARCH_START_S
    assert "--budget" not in without
