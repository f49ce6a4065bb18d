"""`diagnose --budget`: parsing, the split across stages (exact numbers), and bad budgets exiting
2 before anything runs."""

import time
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.diagnose.budget import (
    PLAN_FILL,
    StageNeed,
    duration_text,
    least_at,
    pace,
    parse_budget,
    replan,
    split_budget,
    stage_deadline,
)
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.run import Runner


def test_parse_budget() -> None:
    assert parse_budget("5m") == 300.0
    assert parse_budget("4m30s") == 270.0
    assert parse_budget("1h2m") == 3720.0
    assert parse_budget("90") == 90.0
    assert parse_budget("1.5m") == 90.0
    for bad in ("", "soon", "5x", "4m4m", "m", "0s", "-5m"):
        with pytest.raises(BadUsageError, match="--budget"):
            parse_budget(bad)
    assert duration_text(270.0) == "4m30s" and duration_text(45.5) == "45.5s"
    assert duration_text(300.0) == "5m"


def test_split_gives_each_stage_its_minimum_and_the_sized_ones_the_rest() -> None:
    needs = [StageNeed(stage="data", minimum_s=15.0, sized=False),
             StageNeed(stage="serve", minimum_s=100.0, sized=True),
             StageNeed(stage="llm", minimum_s=50.0, sized=True),
             StageNeed(stage="online", minimum_s=35.0, sized=False)]
    shares = {s.stage: s.share_s for s in split_budget(300.0, needs)}
    # 200 s of minimums; the 100 s left go 2:1 to serve and llm (their minimums' ratio)
    assert shares["data"] == 15.0 and shares["online"] == 35.0
    assert shares["serve"] == pytest.approx(100.0 + 100.0 * 100.0 / 150.0)
    assert shares["llm"] == pytest.approx(50.0 + 100.0 * 50.0 / 150.0)
    assert sum(shares.values()) == pytest.approx(300.0)
    # exactly the minimum: nothing to share
    assert [s.share_s for s in split_budget(200.0, needs)] == [15.0, 100.0, 50.0, 35.0]
    # no sized stage: the spare time stays unused
    fixed = [n for n in needs if not n.sized]
    assert [s.share_s for s in split_budget(300.0, fixed)] == [15.0, 35.0]
    with pytest.raises(BadUsageError, match=r"--budget 3m is under the 3m20s .*data 15s, "
                                            r"serve 1m40s, llm 50s, online 35s"):
        split_budget(180.0, needs)


def test_the_runner_splits_the_config_budget_over_the_enabled_stages(tmp_path: Path) -> None:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("budget: 2m\nstages: {data: {enabled: false}, train: {enabled: false},"
                   " llm: {enabled: false}, retrieval: {enabled: false},"
                   " online: {enabled: false},"
                   " serve: {levels: [1, 2], duration: 2s, batching: ['off'], capacity: false}}\n")
    r = Runner(load_config(cfg, "default"), tmp_path / "out", "default")
    shares = {s.stage: s for s in r.shares}
    # the shared inputs serve needs are lines of their own, before it, so serve's share is
    # its own work
    assert list(shares) == ["features", "served-model", "serve", "model"]
    # serve: a 3 s server start + one step (1.5 s start) over 2 levels x (2 s + 1 s warm-up)
    # = 10.5 s; model 7 s; the features 3.5 s, the served model 6.5 s
    assert shares["serve"].minimum_s == 10.5 and shares["model"].share_s == 7.0
    assert shares["features"].share_s == 3.5 and shares["served-model"].share_s == 6.5
    assert shares["serve"].share_s == 103.0 and r.ctx.shares == {"serve": 103.0}
    # --full drops the config's budget (a cap per level applies instead); --budget overrides
    assert Runner(load_config(cfg, "full"), tmp_path / "o", "full").shares == []
    # (--full's model builds five variants: 12.5 s)
    assert Runner(load_config(cfg, "full"), tmp_path / "o", "full",
                  budget_s=60.0).ctx.shares == {"serve": 37.5}


@pytest.mark.parametrize(("argv", "message"), [
    (["--budget", "soon"], "--budget: 'soon' is not a duration; write e.g. 5m, 4m30s or 300s"),
    (["--budget", "5s"], "--budget 5s is under the"),
])
def test_a_bad_budget_exits_2_before_anything_runs(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run(["diagnose", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_bad_budget_in_the_config_names_its_key(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("budget: lots\n")
    assert run(["diagnose", "--config", str(cfg), "--out", str(tmp_path / "o"), "--json"]) == 2
    got = capsys.readouterr()
    assert "budget" in got.err and "'lots' is not a duration" in got.err
    assert got.out == ""  # --json prints no document on bad usage


def test_the_pace_is_what_the_machine_delivered_against_the_plan() -> None:
    assert pace([(8.0, 50.0)]) == 6.25  # data planned 8 s, took 50 s
    assert pace([(8.0, 12.0), (24.0, 36.0)]) == 1.5
    assert pace([(8.0, 4.0)]) == 1.0  # faster than planned: the later minimums stay
    assert pace([]) == 1.0


def test_a_share_is_replanned_from_what_is_left() -> None:
    now = StageNeed(stage="serve", minimum_s=60.0, sized=True)
    later = [StageNeed(stage="model", minimum_s=20.0, sized=False),
             StageNeed(stage="retrieval", minimum_s=40.0, sized=True)]
    # 200 s left pay the 120 s of needs: serve its 60 s and 60/100 of the 80 s spare
    assert replan(200.0, now, later) == 108.0
    # 60 s left after an overrun, under the leasts (120 s): the fixed model keeps its 20 s
    # least (less measures nothing), serve and retrieval share the other 40 s by their leasts
    assert replan(60.0, now, later) == 24.0
    # the machine ran at half speed so far: the needs double (240 s); of the 200 s left the
    # model keeps its 40 s, serve and retrieval share 160 s by their leasts (120 and 80 s)
    assert replan(200.0, now, later, slow=2.0) == 96.0
    # the last sized stage after an overrun leaves the fixed stage after it its least
    assert replan(30.0, later[1], [StageNeed(stage="online", minimum_s=20.0, sized=False)]) \
        == 10.0
    assert replan(-5.0, now, later) == 0.0
    # a fixed stage that can cut its curve (least 10 of its 20 s) at half speed: 115 s left
    # do not pay the needs (2 x 60 s) but pay the leasts (2 x 50 s), so each stage gets its
    # least and the same 75% of what its minimum adds to it
    model = StageNeed(stage="model", minimum_s=20.0, sized=False, least_s=10.0)
    assert replan(115.0, model, [later[1]], slow=2.0) == 35.0
    assert replan(115.0, later[1], [model], slow=2.0) == 80.0


def test_a_later_fixed_stage_keeps_its_least_with_room_for_its_estimate() -> None:
    """The fresh clone's demo after its test suite (2026-12-07, load 2.5 falling to 1.2): at
    retrieval's start, pace 1.42 and 91.5 s left for retrieval (sized, 66.87 s) and online
    (fixed, 19.26 s, least 14.32 s). In proportion to their needs retrieval took 71.0 s and
    left online 20.5 s, its bare least at the pace (20.3 s): its one step was stopped at the
    budget's end, nothing measured. Online's least is now over PLAN_FILL (the part of its
    share it plans to fill), kept before retrieval's share."""
    retrieval = StageNeed(stage="retrieval", minimum_s=66.87, sized=True)
    online = StageNeed(stage="online", minimum_s=19.26, sized=False, least_s=14.32)
    reserve = 14.32 / PLAN_FILL * 1.42
    assert least_at(online, 1.42) == pytest.approx(reserve, rel=1e-12)  # 23.92 s
    assert least_at(online, 1.0) == 14.32  # a quiet pace: its estimates hold
    assert least_at(retrieval, 1.42) == pytest.approx(66.87 * 1.42, rel=1e-12)
    # never over its minimum at the pace (a stage with nothing to cut)
    assert least_at(StageNeed(stage="m", minimum_s=7.0, sized=False, least_s=6.5), 2.0) == 14.0
    assert replan(91.5, retrieval, [online], slow=1.42) == pytest.approx(91.5 - reserve,
                                                                          rel=1e-12)
    # online, starting with what retrieval left, gets all of it: its least with room
    assert replan(reserve, online, [], slow=1.42) == pytest.approx(reserve, rel=1e-12)
    # not even the fixed leasts fit: a fixed stage gets its least while what is left pays
    # for it; a sized stage before it gets nothing of it
    assert replan(20.0, online, [], slow=1.42) == 20.0
    assert replan(20.0, retrieval, [online], slow=1.42) == 0.0
    # between the leasts and the needs each stage gets its least and the same fraction of
    # the rest: 100 s of needs 66.87 x 1.42 + 19.26 x 1.42 = 122.3 s and leasts 118.9 s
    needs = (66.87 + 19.26) * 1.42
    leasts = 66.87 * 1.42 + reserve
    f = (120.0 - leasts) / (needs - leasts)
    assert replan(120.0, online, [retrieval], slow=1.42) == pytest.approx(
        reserve + f * (19.26 * 1.42 - reserve), rel=1e-12)


def test_a_sized_stage_shares_an_earlier_overrun_with_the_later_stages(tmp_path: Path) -> None:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("stages: {train: {enabled: false}, llm: {enabled: false},"
                   " retrieval: {enabled: false}, model: {enabled: false},"
                   " online: {enabled: false},"
                   " serve: {levels: [1, 2], duration: 2s, batching: ['off'], capacity: false}}\n")
    r = Runner(load_config(cfg, "default"), tmp_path / "out", "default", budget_s=100.0)
    minimum = {s.stage: s.minimum_s for s in r.shares}
    # data 8.42 s (its four levels), the features 3.5, the served model 6.5, serve 10.5:
    # serve gets the rest, 81.58 s
    assert minimum == {"data": pytest.approx(8.42), "features": 3.5, "served-model": 6.5,
                       "serve": 10.5}
    assert r.ctx.shares == {"serve": pytest.approx(81.58)}
    r._reshare("serve")  # at once: all but the report's 6 s (nothing ran: no input needed)
    assert r.ctx.shares["serve"] == pytest.approx(100.0 - 6.0, abs=0.05)
    assert r.ctx.short == set()
    # data took 50 s, not 8.42 (pace 5.94), the inputs as planned: 100 - 60 - 6 x 5.94 left
    # for serve's need of 10.5 x 5.94
    r.started = time.monotonic() - 60.0
    r.spent |= {"data": 50.0, "features": 3.5, "served-model": 6.5}
    r._reshare("serve")
    slow = (50.0 + 3.5 + 6.5) / (8.42 + 3.5 + 6.5)
    assert r.paces["serve"] == pytest.approx(slow)
    assert r.ctx.shares["serve"] == pytest.approx(40.0 - 6.0 * slow, abs=0.05)
    assert r.ctx.short == {"serve"}  # 20.4 s against 10.5 s x 3.26: cut to its decision
    # the stage is stopped at 1.5 times its share, and at the budget's end (less the report's
    # time) at the latest: here 40 - 6 x 3.26 s from now
    assert r.ctx.deadline == pytest.approx(time.monotonic() + 40.0 - 6.0 * slow, abs=0.05)
    # (data, a fixed stage starting first with the whole budget ahead: its 8.42 s share is an
    # estimate, so it may run on until the later stages' leasts (3.5 + 6.5 + 10.5 s) start
    # before the budget's end less the report's 6 s; with a budget of 35 s, 1.5 x its share)
    fresh = Runner(load_config(cfg, "default"), tmp_path / "o2", "default", budget_s=100.0)
    fresh._reshare("data")
    assert fresh.given["data"] == pytest.approx(8.42)
    assert fresh.ctx.deadline == pytest.approx(fresh.started + 100.0 - 6.0 - 20.5, abs=0.05)
    tight = Runner(load_config(cfg, "default"), tmp_path / "o3", "default", budget_s=35.0)
    tight._reshare("data")
    assert tight.ctx.deadline == pytest.approx(
        time.monotonic() + 1.5 * tight.given["data"], abs=0.05)
    # the steps' wall time against their quiet estimates is a pace too: the slower one counts
    r.delivered = [(2.5, 25.0)]
    r._reshare("serve")
    assert r.paces["serve"] == 10.0 and r.ctx.shares["serve"] == 0.0
    r.started = time.monotonic() - 100.0
    r._reshare("serve")  # nothing left: each level runs its one chunk
    assert r.ctx.shares == {"serve": 0.0} and r.given["serve"] == 0.0


def test_the_time_section() -> None:
    from scalelab.lab.core.records import make_record
    from scalelab.lab.diagnose.budget import time_lines

    budget = {"total_s": 280.0, "full": False, "stages": [
        {"stage": "data", "spent_s": 14.2, "minimum_s": 12.0, "share_s": 12.0, "sized": False},
        {"stage": "serve", "spent_s": 120.4, "minimum_s": 109.0, "share_s": 120.0,
         "sized": True, "given_s": 118.0}]}
    sized = make_record(experiment="e", stage="serve", variable="rate", level=40.0, extras={
        "series": "batching=off", "sizing": {
            "chunks": 2, "samples": 1234, "spent_s": 9.6, "share_s": 10.25,
            "stopped": "time share spent",
            "undecided": ["availability ≥ 99.9%: 1,234 requests; 99.9% needs ≥ 2,995 "
                          "without a failure"]}})
    assert time_lines(budget, [sized, make_record(experiment="e", stage="data",
                                                  variable="x", level=1.0)]) == [
        "budget 4m40s: each stage its minimum, the sized stages the rest; spent: data 14 s "
        "(minimum 12 s), serve 120 s of a 118 s share",
        "serve batching=off at 40: 2 chunk(s), 1,234 samples in 9.6 s of a 10.2 s share, "
        "time share spent; undecided for lack of time: availability ≥ 99.9%: 1,234 requests; "
        "99.9% needs ≥ 2,995 without a failure",
    ]
    assert time_lines({"total_s": None, "full": True, "stages": []}, []) == [
        "no budget: --full, each sized level until decided or its cap"]


def test_a_stage_stops_where_the_later_stages_leasts_start() -> None:
    """Exact: at t=100 s, budget end 256 s, later leasts 22.5 s (so they start at 233.5 s)."""
    # A sized stage: 1.5x its share, cut where the later leasts start (never under its share).
    assert stage_deadline(100, 89.8, 256, 22.5, sized=True, slack=1.5) == 233.5
    assert stage_deadline(100, 150, 256, 22.5, sized=True, slack=1.5) == 250.0
    assert stage_deadline(100, 20, 256, 22.5, sized=True, slack=1.5) == 130.0
    # A fixed stage may run past 1.5x its share up to there: its share is an estimate.
    assert stage_deadline(100, 16, 256, 22.5, sized=False, slack=1.5) == 233.5
    assert stage_deadline(100, 16, 256, 200, sized=False, slack=1.5) == 124.0
    # Never past the budget's end, never before now.
    assert stage_deadline(100, 200, 256, 0, sized=False, slack=1.5) == 256.0
    assert stage_deadline(300, 10, 256, 0, sized=True, slack=1.5) == 300.0


def test_the_budget_counts_from_the_process_start_unless_a_host_calls_in_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh `scalelab diagnose` process counts its interpreter's start; a process that ran
    for minutes before (a suite's worker) counts from now, or its budget is spent at once."""
    import psutil

    from scalelab.lab.diagnose import run as run_module

    class Proc:
        def __init__(self, age: float) -> None:
            self.age = age

        def create_time(self) -> float:
            return time.time() - self.age

    monkeypatch.setattr(psutil, "Process", lambda: Proc(2.0))
    assert time.monotonic() - run_module.process_started() == pytest.approx(2.0, abs=0.05)
    monkeypatch.setattr(psutil, "Process", lambda: Proc(400.0))
    assert time.monotonic() - run_module.process_started() == pytest.approx(0.0, abs=0.05)


def test_a_stage_with_no_time_before_its_deadline_is_not_run(tmp_path: Path) -> None:
    """A sized stage given no share (its deadline now) starts nothing, not even its servers:
    the serve stage's reference servers would otherwise start (seconds, unbounded by the
    deadline) before it found no step could start."""
    from scalelab.lab.diagnose.stages.train import FEATURES, SERVED_MODEL

    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("stages: {data: {enabled: false}, train: {enabled: false},"
                   " llm: {enabled: false}, retrieval: {enabled: false},"
                   " model: {enabled: false}, online: {enabled: false},"
                   " serve: {levels: [1, 2], duration: 1s, batching: ['off'], capacity: false}}\n")
    # The budget spent before the first stage (a 40 s start-up: pace 40 / 2.5 = 16).
    r = Runner(load_config(cfg, "default"), tmp_path / "out", "default", budget_s=30.0,
               started=time.monotonic() - 40.0)
    r.ctx.provide(FEATURES, None)
    r.ctx.provide(SERVED_MODEL, None)
    d = r.run()
    assert r.given["serve"] == 0.0 and r.spent["serve"] == 0.0
    assert d.steps == []  # nothing started, nothing failed
    assert r.ctx.notes == [
        "serve: not measured: its 0 s share at this run's pace (16× the quiet estimates) left "
        "0 s before its deadline, under the 1 s a step needs to start; a larger --budget "
        "measures it"]
