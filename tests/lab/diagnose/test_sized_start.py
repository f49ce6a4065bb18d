"""The budget's start-up rules: a sized stage (serve, llm, retrieval) whose time before its
deadline cannot pay its start-up (servers, corpora) and its target's first chunk at this
run's pace starts nothing and says the --budget that would pay it; a shared input (the
features, the served model) that cannot fit is not built, and the stages needing it say so."""

import json
import time
from pathlib import Path

import pytest

from scalelab.lab.diagnose.budget import budget_paying, budget_text
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.run import Runner
from scalelab.lab.diagnose.schema import Prices
from scalelab.lab.diagnose.stages import llm, retrieval, serve, train
from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.steps import Step, StepResult

NOW = 1000.0


def test_the_budget_that_pays_a_stage_more_seconds() -> None:
    # a sized stage gets its part of each extra second: 30 s more at a quarter is 120 s more
    assert budget_paying(260.0, 30.0, 0.25) == 380.0
    # a fixed stage or a shared input gets all of it (part 1; no part: all of it too)
    assert budget_paying(260.0, 30.0, 1.0) == 290.0
    assert budget_paying(260.0, 30.0, 0.0) == 290.0
    # rounded up to 10 s, as --budget reads it back
    assert budget_text(312.4) == "5m20s" and budget_text(320.0) == "5m20s"
    assert budget_text(45.0) == "50s" and budget_text(300.0) == "5m"


def _ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, left_s: float,
         pace: float) -> tuple[Context, list[Step]]:
    """A context whose stage has `left_s` before its deadline at a frozen clock, the budget's
    split giving the stage a quarter of any extra second of a 260 s budget."""
    monkeypatch.setattr(time, "monotonic", lambda: NOW)
    ran: list[Step] = []

    def run(step: Step) -> StepResult:
        ran.append(step)
        return StepResult(step=step, ok=True, returncode=0, wall_s=0.0)

    ctx = Context(work=tmp_path, logs=tmp_path / "logs", repeats=1, prices=Prices(),
                  settings={}, run=run, fail=lambda step, why: pytest.fail(why),
                  share_s=left_s / 1.5, deadline=NOW + left_s, pace=pace,
                  budget_for=lambda stage, more_s: budget_paying(260.0, more_s, 0.25))
    return ctx, ran


def test_a_start_that_fits_before_the_deadline_starts(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, _ = _ctx(tmp_path, monkeypatch, left_s=20.0, pace=2.5)
    assert ctx.unpaid("llm", 8.0) is None  # 8 s x 2.5 = 20 s: exactly what is left
    assert not ctx.unpaid_start("llm", "starting its servers", 8.0) and ctx.notes == []
    # 8.1 s x 2.5 = 20.25 s: 0.25 s short, a quarter of each extra second: 1 s more budget
    assert ctx.unpaid("llm", 8.1) == (
        "needs ~20.2 s at this run's pace (2.5× the quiet estimate of 8.1 s), 20 s were left "
        "before its deadline; about --budget 4m30s would pay it")


def test_the_llm_stage_starts_no_server_its_share_cannot_pay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The llm stage at pace 2.5 with 20 s left: its servers' start (13 s) and its target's
    first chunk (8 s), 52.5 s at that pace, do not fit; 32.5 s short at a quarter of each
    extra second is 130 s more than 260 s."""
    cfg = load_config(None, "default")
    ctx, ran = _ctx(tmp_path, monkeypatch, left_s=20.0, pace=2.5)
    llm.STAGE.run(cfg.stages.llm, ctx)
    assert ran == [] and ctx.notes == [
        "llm: not measured: starting its 2 engine server(s) and its target's first chunk "
        "needs ~52.5 s at this run's pace (2.5× the quiet estimate of 21 s), 20 s were left "
        "before its deadline; about --budget 6m30s would pay it"]


def test_the_retrieval_stage_builds_no_corpus_its_share_cannot_pay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retrieval's fixed work (60 s quiet: the corpora embedded, the indexes built, the
    target's first pass) at pace 2 is 120 s; 25 s left (the 2026-12-07 run that spent 25 s
    on its 10x corpus and measured nothing)."""
    cfg = load_config(None, "default")
    ctx, ran = _ctx(tmp_path, monkeypatch, left_s=25.0, pace=2.0)
    retrieval.STAGE.run(cfg.stages.retrieval, ctx)
    assert ran == [] and ctx.notes == [
        "retrieval: not measured: building its corpora and indexes and its target's first "
        "chunk needs ~120 s at this run's pace (2× the quiet estimate of 60 s), 25 s were "
        "left before its deadline; about --budget 10m40s would pay it"]
    # 60 s left on a quiet machine (pace 1): it fits exactly, and the bench runs
    ctx, ran = _ctx(tmp_path, monkeypatch, left_s=60.0, pace=1.0)
    retrieval.STAGE.run(cfg.stages.retrieval, ctx)
    assert [s.label for s in ran][:1] == ["retrieval bench 10× #1"] and ctx.notes == []


def test_the_serve_stage_starts_no_server_its_share_cannot_pay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One server (3 s), its step's start (1.5 s) and two 1 s levels with their 1 s
    warm-ups (4 s): 8.5 s quiet, 34 s at pace 4 against 30 s left."""
    cfg = load_config(None, "default").stages.serve.model_copy(update={
        "levels": [1.0, 2.0], "duration": "1s", "batching": ["off"], "capacity": False})
    ctx, ran = _ctx(tmp_path, monkeypatch, left_s=30.0, pace=4.0)
    repo = tmp_path / "repo"
    (repo / "flights" / "1").mkdir(parents=True)
    ctx.provide(train.FEATURES, tmp_path / "dataset")
    ctx.provide(train.SERVED_MODEL, repo)
    serve.STAGE.run(cfg, ctx)
    assert ran == [] and ctx.notes == [
        "serve: not measured: starting its 1 server(s) and its target's first chunk needs "
        "~34 s at this run's pace (4× the quiet estimate of 8.5 s), 30 s were left before its "
        "deadline; about --budget 4m40s would pay it"]


def test_a_shared_input_that_cannot_fit_is_not_built_and_its_stages_say_so(
        tmp_path: Path) -> None:
    """The budget spent before the first stage (40 s of start-up against its 2.5 s: pace 16):
    the features (3.5 s quiet, 56 s at that pace) are not built, so neither is the served
    model made from them, and the serve stage needing both names what did not fit and the
    --budget that would pay it (30 s + the 56 s it lacked, a shared input taking all of an
    extra second: 1m30s)."""
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("stages: {data: {enabled: false}, train: {enabled: false},"
                   " llm: {enabled: false}, retrieval: {enabled: false},"
                   " model: {enabled: false}, online: {enabled: false},"
                   " serve: {levels: [1, 2], duration: 1s, batching: ['off'], capacity: false}}\n")
    r = Runner(load_config(cfg, "default"), tmp_path / "out", "default", budget_s=30.0,
               started=time.monotonic() - 40.0)
    d = r.run()
    assert d.steps == [] and r.spent == {"features": 0.0, "served-model": 0.0, "serve": 0.0}
    why = ("needs ~56 s at this run's pace (16× the quiet estimate of 3.5 s), 0 s were left "
           "before its deadline; about --budget 1m30s would pay it")
    assert r.ctx.notes == [
        f"features (a shared input): not built: {why}",
        "served-model (a shared input): not built: its input features was not built",
        f"serve: not measured: the shared input features did not fit ({why})"]
    # what the first screen reads (report.screen.budget_of): the numbers, the input named
    unpaid = json.loads((tmp_path / "out" / "run.json").read_text("utf-8"))["unpaid"]
    assert unpaid["serve"] == {"need_s": 56.0, "left_s": 0.0, "budget_s": pytest.approx(86.0,
                                                                                     abs=0.1),
                               "input": "features"}


def test_the_budget_for_a_stage_is_its_part_of_the_sized_stages(tmp_path: Path) -> None:
    """The demo's config at 4m20s: the serve stage gets its minimum's part of the sized
    stages' minimums of each extra second; a fixed stage all of it."""
    r = Runner(load_config(None, "default"), tmp_path / "out", "default", budget_s=260.0)
    sized = {sh.stage: sh.minimum_s for sh in r.shares if sh.sized}
    assert set(sized) == {"serve", "llm", "retrieval"}
    part = sized["serve"] / sum(sized.values())
    assert r.ctx.budget_for("serve", 10.0) == pytest.approx(260.0 + 10.0 / part, rel=1e-12)
    assert r.ctx.budget_for("train", 10.0) == 270.0


def test_a_shared_inputs_deadline_protects_only_the_stages_that_do_not_need_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The features stopped at 1.5× their share leave train, serve and model (which read them)
    nothing to measure (the demo of 2026-12-07 21:12 UTC lost all three so): their deadline
    is where the stages that do not need them (llm, retrieval, online) could no longer get
    their leasts, at a frozen clock and pace 1."""
    from scalelab.lab.diagnose import run as run_module

    monkeypatch.setattr(time, "monotonic", lambda: NOW)
    # 100 s of the 260 s budget gone: every later stage's least no longer fits
    r = Runner(load_config(None, "default"), tmp_path / "out", "default", budget_s=260.0,
               started=NOW - 100.0)
    assert r._needing("features") == {"train", "served-model", "serve", "model"}
    assert r._needing("served-model") == {"serve", "model"}
    assert r._needing("train") == set()
    r._reshare("data")  # a stage: every later stage protected, 1.5 times its share
    assert r.ctx.share_s is not None and r.ctx.deadline == NOW + 1.5 * r.ctx.share_s
    r._reshare("features")
    floors = {sh.stage: sh.least_s if sh.least_s is not None else sh.minimum_s
              for sh in r.shares}
    end = NOW - 100.0 + 260.0 - run_module.REPORT_S
    assert r.ctx.deadline == pytest.approx(
        end - floors["llm"] - floors["retrieval"] - floors["online"], abs=1e-9)
