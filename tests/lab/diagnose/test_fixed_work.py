"""The fixed stages (data, train, model, online) under a budget: each cuts its work to what its
decision needs when its share is small, says what it cut and why with the numbers, and a step
still running at its stage's deadline is stopped as a cut, not a failure."""

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scalelab.lab.diagnose.budget import (
    PLAN_FILL,
    Part,
    StageNeed,
    Work,
    plan_parts,
    split_budget,
)
from scalelab.lab.diagnose.commands import Command, Compress, DataBench, Sweep, TrainBench
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.run import Runner, steps_info
from scalelab.lab.diagnose.schema import Prices
from scalelab.lab.diagnose.stages import data, model, online, train
from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.steps import Step, StepResult, run_step


def test_a_plan_keeps_what_the_decision_needs_then_what_fits() -> None:
    work = Work(fixed_s=2.0, parts=(Part(name="1×", cost_s=1.0, needed=True),
                                    Part(name="10×", cost_s=4.0, needed=True),
                                    Part(name="2×", cost_s=1.5), Part(name="5×", cost_s=2.5)))
    assert work.whole_s == 11.0 and work.least_s == 7.0
    # 9 s at pace 1: the needed 7 s, then 2x (1.5 s); 5x (2.5 s) no longer fits
    p = plan_parts(work, share_s=9.0, slow=1.0)
    assert [x.name for x in p.kept] == ["1×", "10×", "2×"] and p.cost_s == 8.5
    assert p.note("data") == (
        "data: 5× (curve point) not measured: its 9 s share at this run's pace (1× the quiet "
        "estimates) pays for 1×, 10×, 2× (~8.5 s); the rest needed ~2.5 s more")
    # the same share on a machine twice as slow: only what the decision needs
    assert [x.name for x in plan_parts(work, share_s=9.0, slow=2.0).kept] == ["1×", "10×"]
    # a part that does not fit is skipped; a cheaper one after it still runs
    assert [x.name for x in plan_parts(work, share_s=9.6, slow=1.0).kept] == ["1×", "10×", "2×"]
    cheap_last = Work(fixed_s=0.0, parts=(Part(name="a", cost_s=3.0), Part(name="b", cost_s=1.0)))
    assert [x.name for x in plan_parts(cheap_last, share_s=2.0).kept] == ["b"]
    # no budget: everything, nothing to say
    whole = plan_parts(work, share_s=None)
    assert len(whole.kept) == 4 and whole.note("data") is None


def test_a_budget_under_the_whole_work_cuts_each_stage_toward_its_least() -> None:
    needs = [StageNeed(stage="data", minimum_s=10.0, sized=False, least_s=6.0),
             StageNeed(stage="serve", minimum_s=50.0, sized=True)]
    # 60 s pay both wholes; 58 s: data gets its 6 s and half of the 4 s its curve adds
    assert [s.share_s for s in split_budget(60.0, needs)] == [10.0, 50.0]
    assert [s.share_s for s in split_budget(58.0, needs)] == [8.0, 50.0]
    assert [s.share_s for s in split_budget(56.0, needs)] == [6.0, 50.0]
    with pytest.raises(Exception, match="under the 56s the enabled stages need at least"):
        split_budget(55.0, needs)


def _ctx(tmp_path: Path, *, share_s: float | None, pace: float = 1.0) -> tuple[Context,
                                                                               list[Step]]:
    ran: list[Step] = []

    def run(step: Step) -> StepResult:
        ran.append(step)
        return StepResult(step=step, ok=True, returncode=0, wall_s=0.0)

    ctx = Context(work=tmp_path, logs=tmp_path / "logs", repeats=1, prices=Prices(),
                  settings={}, run=run, fail=lambda step, why: pytest.fail(why),
                  share_s=share_s, pace=pace)
    repo = tmp_path / "repo"
    (repo / "flights" / "1").mkdir(parents=True)
    ctx.provide(train.FEATURES, tmp_path / "dataset")
    ctx.provide(train.SERVED_MODEL, repo)
    return ctx, ran


def _commands(tmp_path: Path, share_s: float | str | None, pace: float = 1.0) -> tuple[
        dict[str, Command], list[str]]:
    """Each fixed stage of the demo's config run with this share ("least": what its decision
    needs at least, quiet; "short": a tenth less); its step's command."""
    cfg = load_config(None, "default")
    out: dict[str, Command] = {}
    notes: list[str] = []
    for st in (data.STAGE, train.STAGE, model.STAGE, online.STAGE):
        least = st.least_s(st.of(cfg), 1)
        share = {"least": least, "short": 0.9 * least}.get(str(share_s), share_s)
        ctx, ran = _ctx(tmp_path / st.name, share_s=share, pace=pace)  # type: ignore[arg-type]
        st.run(st.of(cfg), ctx)
        assert len(ran) <= 1
        if ran:
            assert ran[0].command is not None and ran[0].estimate_s
            out[st.name] = ran[0].command
        notes += ctx.notes
    return out, notes


def _what(cmds: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in {
        "data": cmds["data"].scale if "data" in cmds else None,
        "train": (cmds["train"].nproc, cmds["train"].steps) if "train" in cmds else None,
        "model": cmds["model"].variants if "model" in cmds else None,
        "online": cmds["online"].policies if "online" in cmds else None}.items() if v}


def test_each_fixed_stage_given_a_tiny_share_does_less_and_says_so(tmp_path: Path) -> None:
    whole, notes = _commands(tmp_path / "whole", share_s=None)
    assert _what(whole) == {"data": [1, 10, 2, 5], "train": ([1, 2, 4], 30),
                            "model": ["int8", "prune-structured-50", "distill"],
                            "online": ["never", "monthly", "weekly", "daily", "drift"]}
    assert notes == []
    small, notes = _commands(tmp_path / "small", share_s="least")
    # the base and the target of each; train keeps its global batch and its 30 steps
    assert _what(small) == {"data": [1, 10], "train": ([1, 4], 30), "model": ["int8"],
                            "online": ["monthly", "daily"]}
    assert isinstance(small["train"], TrainBench) and small["train"].batch == 32768
    assert isinstance(small["data"], DataBench) and isinstance(small["model"], Compress)
    assert notes[0] == (
        "data: 2×, 5× (curve point) not measured: its 6.79 s share at this run's pace (1× the "
        "quiet estimates) pays for 1×, 10× (~6.79 s); the rest needed ~1.63 s more")
    assert notes[1].startswith("train: 2 worker(s) (curve point) not measured: its 28.9 s "
                               "share")
    assert notes[2].startswith("model: prune-structured-50, distill (candidate series) not "
                               "measured")
    assert notes[3].startswith("online: policy never, policy weekly, policy drift (candidate "
                               "series and curve point) not measured")
    # a tenth less: train runs fewer steps (the batch stays): its share is within
    # ESTIMATE_MARGIN of what 10 steps need; data, a tenth short of its least, starts nothing
    short, notes = _commands(tmp_path / "short", share_s="short")
    assert _what(short)["train"] == ([1, 4], 10)
    assert [n for n in notes if "instead of" in n] == [
        "train: 10 optimizer steps a worker count instead of 30 (the global batch stays "
        "32,768): its 26 s share at this run's pace (1× the quiet estimates) pays for "
        "~26.4 s; 30 steps needed ~28.9 s"]
    # under that margin it starts nothing
    cfg = load_config(None, "default")
    ctx, ran = _ctx(tmp_path / "steps", share_s=23.5, pace=1.0)
    train.STAGE.run(cfg.stages.train, ctx)
    assert ran == [] and ctx.notes[1:] == [
        "train: not measured: its 23.5 s share at this run's pace (1× the quiet estimates) "
        "pays for less than its decision needs (~26.4 s); a larger --budget would measure it"]
    # a share under that whose deadline lets it overrun (the later stages' leasts far off) runs
    ctx, ran = _ctx(tmp_path / "overrun", share_s=16.0, pace=1.0)
    ctx.deadline = time.monotonic() + 60.0
    train.STAGE.run(cfg.stages.train, ctx)
    assert _what({"train": ran[0].command})["train"] == ([1, 4], 10)
    assert "data: not measured: its 6.11 s share at this run's pace (1× the quiet estimates) " \
           "pays for less than its decision needs (~6.79 s); a larger --budget would measure it" \
        in notes
    # a share that pays for the whole work on a quiet machine does not on one twice as slow
    cfg = load_config(None, "default")
    at_pace, _ = _commands(tmp_path / "pace", share_s=data.STAGE.minimum_s(cfg.stages.data, 1),
                           pace=1.2)
    assert at_pace["data"].scale == [1, 10]  # type: ignore[attr-defined]


def _sleeper(seconds: float) -> Command:
    return Sweep(var="n=1", command=[sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_a_step_running_at_its_stage_deadline_is_stopped_as_a_cut(tmp_path: Path) -> None:
    step = Step(stage="data", label="sleeps", command=_sleeper(60), timeout_s=600)
    t0 = time.monotonic()
    res = run_step(step, logs=tmp_path, experiment="e", sink=tmp_path / "r.jsonl",
                   stop_at=time.monotonic() + 3.0)
    assert time.monotonic() - t0 < 30.0  # stopped, not waited for
    assert not res.ok and res.error is None and res.cut is not None
    assert res.cut.startswith("stopped at its stage's deadline after ")
    # its own timeout, earlier than the deadline, is a failure as before
    res = run_step(Step(stage="data", label="short", command=_sleeper(60), timeout_s=2.0),
                   logs=tmp_path, experiment="e", sink=tmp_path / "r.jsonl",
                   stop_at=time.monotonic() + 300.0)
    assert res.cut is None and res.error == "timed out after 2 s"


def test_a_step_with_no_share_left_is_not_started_and_fails_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("stages: {train: {enabled: false}, serve: {enabled: false},"
                   " llm: {enabled: false}, retrieval: {enabled: false},"
                   " model: {enabled: false}, online: {enabled: false}}\n")
    r = Runner(load_config(cfg, "default"), tmp_path / "out", "default", budget_s=60.0)
    r._reshare("data")
    r.ctx.deadline = time.monotonic() + 0.5
    res = r.ctx.run(Step(stage="data", label="late", command=_sleeper(60)))
    # data's share: its whole work's 8.42 s (the budget pays for it)
    assert not res.ok and res.cut == "not started: 0.5 s of its stage's 8.42 s share were left"
    assert r.ctx.notes == ["data: late: not measured: not started: 0.5 s of its stage's 8.42 s "
                           "share were left"]
    failed = StepResult(step=Step(stage="data", label="broke", command=None), ok=False,
                        returncode=2, wall_s=1.0, error="exit 2: bad")
    assert steps_info([res, failed]) == {
        "failed_steps": [{"stage": "data", "step": "broke", "error": "exit 2: bad"}],
        "cut_steps": [{"stage": "data", "step": "late", "why": res.cut}]}


def test_a_slow_start_cuts_the_fixed_stages_toward_their_leasts(tmp_path: Path) -> None:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("stages: {train: {enabled: false}, serve: {enabled: false},"
                   " llm: {enabled: false}, retrieval: {enabled: false},"
                   " model: {enabled: false}}\n")
    c = load_config(cfg, "default")
    r = Runner(c, tmp_path / "out", "default", budget_s=70.0)
    whole = [data.STAGE.minimum_s(c.stages.data, 1), online.STAGE.minimum_s(c.stages.online, 1)]
    least = [data.STAGE.least_s(c.stages.data, 1), online.STAGE.least_s(c.stages.online, 1)]
    # at a pace over 1 a fixed stage's least has room for its estimate: over PLAN_FILL
    least = [lst / PLAN_FILL for lst in least]
    # the start-up took 5 s, twice its quiet 2.5 s: 70 - 5 - 6 x 2 s are left for needs of
    # 2 x (8.42 + 19.26) s, which pay for the leasts (2 x (7.99 + 16.85) s): data gets its
    # least and the same fraction of its curve points as online
    r.started = time.monotonic() - 5.0
    r.delivered = [(2.5, 5.0)]
    r._reshare("data")
    f = (53.0 - 2 * sum(least)) / (2 * sum(whole) - 2 * sum(least))
    assert 0 < f < 1
    assert r.given["data"] == pytest.approx(2 * least[0] + f * 2 * (whole[0] - least[0]),
                                            abs=0.05)
