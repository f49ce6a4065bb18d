"""The first screen, and every renderer reading the one verdict object."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recordkit import M, demo_records
from scalelab.cli import run
from scalelab.lab.core.records import append_records
from scalelab.lab.core.sheet import SheetRow, build_sheet
from scalelab.lab.core.verdict import Advice, StageVerdict, Verdict, judge
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.gate import gate_failure as gate
from scalelab.lab.diagnose.goals import stage_goals
from scalelab.lab.report.document import render_html, render_markdown, report_json
from scalelab.lab.report.screen import RunBudget, plain_lines, screen_line

DEMO_SCREEN = """\
scalelab: 7 stages · 1 missed, 2 undecided, 4 met · train first misses at 2×
stage      verdict             cap/target  limit             do
data       holds to 10×        10× / 10×   cpu 1.94/2 cores  partition
train      first misses at 2×  1× / 4×     cores ×2          fix communication
serve      undecided           — / 10×     none saturated    run 1 replica(s)
llm        holds to 10×        10× / 10×   not measured      (in report)
model      holds to 1×         1× / 1×     not measured      compress
retrieval  undecided           2× / 10×    not measured
online     holds to 30×        30× / 30×   not measured      (in report)
do (retrieval): no approximate index met every objective
serve: availability ≥ 99.9% at 10× needs 2,995 requests: 30.6 s at 98 req/s
retrieval: p99 ≤ 20 ms at the arrival rate at 10× needs more than 3,000 requests
"""


def _demo_dir(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    append_records(out / "records.jsonl", demo_records())
    return out


def test_the_demo_first_screen_fits_15_lines_of_80_columns_through_a_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the demo's own short path: scalelab-out
    _demo_dir(tmp_path)
    out = Path("out")
    # A real pipe: no terminal, no COLUMNS.
    piped = subprocess.run([sys.executable, "-m", "scalelab", "report", str(out)],
                           capture_output=True, text=True, check=True, env={
                               "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    text = piped.stdout
    lines = text.splitlines()
    assert text.startswith(DEMO_SCREEN)
    # then where the report is, wrapped here (not by a terminal)
    assert " ".join(ln.strip() for ln in lines[len(DEMO_SCREEN.splitlines()):]) == (
        "report: out/report.html · sheet and long verdict: scalelab report out --verbose")
    assert len(lines) <= 15 and max(len(ln) for ln in lines) <= 80
    # --verbose: the long verdict and the full sheet first (report.md), then the screen.
    assert run(["report", str(out), "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert verbose.startswith("# scalelab diagnosis") and verbose.endswith(text)
    assert "## Sheet" in verbose and "- limiting: communication — 51% of step time" in verbose


def _demo_verdict() -> tuple[Verdict, list[SheetRow]]:
    sheet = build_sheet(demo_records())
    goals = stage_goals(load_config(None, "default"))
    return judge(goals, sheet, cores=M.cores, memory_bytes=M.memory_bytes), sheet


def _renders(v: Verdict, sheet: list[SheetRow], *, html: bool = True) -> dict[str, str]:
    goals = stage_goals(load_config(None, "default"))
    out = {
        "screen": "\n".join(plain_lines(v, "out/report.html")),
        "markdown": render_markdown(sheet, v, M, {"mode": "default"}),
        "json": json.dumps(report_json(sheet, v, M, {"mode": "default"})["verdict"],
                           ensure_ascii=False),
    }
    if html:  # its plots cost seconds
        out["html"] = render_html(sheet, v, goals, M, {"mode": "default"})
    return out


def test_numbers_are_for_people_in_every_rendering() -> None:
    v, sheet = _demo_verdict()
    r = _renders(v, sheet, html=False)  # the HTML shows the same cells (sheet_cells)
    for fmt, text in r.items():
        assert not re.search(r"\d\.\d+e[+-]\d", text), fmt  # never 3.399e+08
    md = r["markdown"]
    assert "| data | — | 1 | 1 | 337k rows | 70.4k rows/s |" in md
    assert "| 324 MiB | 1.49% |" in md  # peak memory and failure rate at 1×
    assert "misses scaling efficiency ≥ 70% at 2× (63%, point (1 repeat))" in md


def test_every_renderer_reads_the_same_object() -> None:
    v, sheet = _demo_verdict()
    before = _renders(v, sheet)
    # A change in the object (the serve stage's action, a failure of the llm stage) shows in
    # the terminal, Markdown, HTML and JSON alike: no renderer keeps its own copy.
    changed = Verdict(stages=tuple(
        dataclasses.replace(s, advice=Advice(intervention="shed load: a <queue> bound"))
        if s.stage == "serve" else
        dataclasses.replace(s, failure="the engine never started") if s.stage == "llm" else s
        for s in v.stages))
    after = _renders(changed, sheet)
    for fmt in ("screen", "markdown", "html", "json"):
        assert "shed load" not in before[fmt] and "shed load" in after[fmt], fmt
        assert "the engine never started" in after[fmt], fmt
    assert "llm        failed" in after["screen"]
    assert "shed load: a &lt;queue&gt; bound" in after["html"]
    doc = json.loads(after["json"])
    llm = next(s for s in doc["stages"] if s["stage"] == "llm")
    assert (llm["outcome"], llm["failure"], doc["outcome"]) == (
        "failed", "the engine never started", "failed")


def test_fail_on_reads_the_object() -> None:
    v, _ = _demo_verdict()
    assert gate(v, None) is None
    assert gate(v, "miss") == (
        "gate failed (--fail-on miss): train misses scaling efficiency ≥ 70% at 2×")
    held = Verdict(stages=tuple(s for s in v.stages if s.outcome == "met"))
    assert held.outcome == "met"
    assert gate(held, "miss") is None and gate(held, "undecided") is None
    undecided = Verdict(stages=tuple(s for s in v.stages if s.stage in ("data", "serve")))
    assert gate(undecided, "miss") is None
    assert gate(undecided, "undecided") == (
        "gate failed (--fail-on undecided): serve undecided (undecided at 10×: availability "
        "≥ 99.9% needs 2,995 requests (measured 1,180): 30.6 s at the 98 requests/s this run "
        "measured at 10×; also undecided at 1×, 2×, 5×)")
    failed = Verdict(stages=(dataclasses.replace(held.stages[0], failure="refused"),))
    assert gate(failed, "undecided") == "gate failed (--fail-on undecided): data failed"


def test_on_a_terminal_the_same_cells_are_a_rich_table() -> None:
    from io import StringIO

    from rich.console import Console

    from scalelab.lab.report.screen import print_screen

    v, _ = _demo_verdict()
    buf = StringIO()
    print_screen(Console(file=buf, force_terminal=True, width=120, color_system=None), v,
                 "out/report.html")
    text = buf.getvalue()
    flat = " ".join(text.split())
    assert "train first misses at 2× 1× / 4× (1k samples/s) cores ×2 fix communication" in flat
    assert "no approximate index met every objective" in text  # room for every action
    assert "serve: availability ≥ 99.9% at 10× needs 2,995 requests: 30.6 s at 98 req/s" in text


def test_curve_points_are_labelled_and_decide_nothing_they_did_not_decide() -> None:
    from recordkit import rec
    from scalelab.lab.core.objectives import Objective
    from scalelab.lab.core.verdict import StageGoal

    # 1× and 2× measured briefly for the picture (too few requests to decide p95), 10× sized
    # until decided: the stage holds to its target, and the curve points say what they are.
    recs = [rec("serve", "rate", lvl, rate=lvl, p95=10.0, extras={"samples": n},
                purpose="curve" if lvl < 100 else "decision")
            for lvl, n in ((10, 30), (20, 30), (100, 3000))]
    goal = StageGoal(stage="serve", objectives=[Objective(metric="p95_ms", max=50)])
    v = judge([goal], build_sheet(recs), cores=2, memory_bytes=M.memory_bytes)
    s = v.stages[0]
    assert [c.outcome for c in s.checks] == ["undecided", "undecided", "met"]
    assert (s.outcome, s.passed_up_to, s.curve_multiples, s.undecided) == (
        "met", 10.0, (1.0, 2.0), ())
    md = render_markdown(build_sheet(recs), v, M, {})
    assert "| serve | — | 1 | p95_ms ≤ 50 | undecided (curve point) |" in md
    assert "- curve points (measured for the picture, not decisions): 1×, 2×" in md
    assert plain_lines(v, "r.html")[2].startswith("serve  holds to 10×  10× / 10×")


def test_curve_points_alone_that_decided_nothing_leave_the_stage_undecided() -> None:
    from recordkit import rec
    from scalelab.lab.core.objectives import Objective
    from scalelab.lab.core.verdict import StageGoal

    # A stage cut after its first curve points, none of which decided p95: nothing is met, so
    # the stage is open, not "holds to — (below target)".
    recs = [rec("serve", "rate", lvl, rate=lvl, p95=10.0, extras={"samples": 30},
                purpose="curve") for lvl in (10, 20)]
    goal = StageGoal(stage="serve", objectives=[Objective(metric="p95_ms", max=50)])
    s = judge([goal], build_sheet(recs), cores=2, memory_bytes=M.memory_bytes).stages[0]
    assert (s.passed_up_to, s.outcome) == (None, "undecided")
    assert plain_lines(Verdict(stages=(s,)), "r.html")[2].split()[:2] == ["serve", "undecided"]


def test_a_stage_with_several_open_checks_gets_one_line_sized_by_the_largest() -> None:
    """The open checks of a stage are sized at one level, so the one needing the most samples
    pays for the others: the first screen says that one, and how many checks it decides."""
    from scalelab.lab.core.decide import Decision
    from scalelab.lab.core.objectives import Check, Objective
    from scalelab.lab.core.verdict import Need
    from scalelab.lab.report.screen import need_note

    def need(label: str, metric: str, samples: int) -> Need:
        o = Objective(metric=metric, max=2000, label=label)
        c = Check(stage="llm", series="baseline", level=10.0, multiple=10.0, objective=o,
                  decision=Decision(outcome="undecided", value=1.0, n=40,
                                    basis="order statistic"))
        return Need(check=c, samples=samples, measured=40, unit="requests", per_second=5.0)

    ttft, avail = need("TTFT p95 ≤ 2 s", "p95_ms", 59), need("avail", "p95_ms", 299)
    assert need_note("llm", (ttft, avail)) == (
        "llm: avail at 10× (and 1 other check) needs 299 requests: 59.8 s at 5 req/s")
    assert need_note("llm", (ttft,)) == (
        "llm: TTFT p95 ≤ 2 s at 10× needs 59 requests: 11.8 s at 5 req/s")
    # the budget that pays it: 259 more requests at 5/s = 51.8 s more for llm, which gets 40%
    # of any extra second (its minimum 40 of the sized stages' 100): 260 + 129.5 -> 6m30s
    budget = RunBudget(total_s=260.0, part={"llm": 0.4, "serve": 0.6})
    assert need_note("llm", (ttft, avail), budget=budget) == (
        "llm: avail at 10× (and 1 other check) needs 299 requests: 59.8 s at 5 req/s; "
        "about --budget 6m30s would pay it")
    assert need_note("model", (ttft,), budget=budget).endswith("11.8 s at 5 req/s")


def test_the_runs_budget_and_split_are_read_beside_the_report(tmp_path: Path) -> None:
    from scalelab.lab.report.screen import budget_of

    (tmp_path / "run.json").write_text(json.dumps({"budget": {"total_s": 260.0, "stages": [
        {"stage": "data", "minimum_s": 8.0, "sized": False},
        {"stage": "serve", "minimum_s": 90.0, "sized": True},
        {"stage": "llm", "minimum_s": 30.0, "sized": True}]}}))
    got = budget_of(tmp_path / "report.html")
    assert got == RunBudget(total_s=260.0, part={"serve": 0.75, "llm": 0.25})
    (tmp_path / "run.json").write_text(json.dumps({"budget": {"total_s": None, "stages": []}}))
    assert budget_of(tmp_path / "report.html") is None
    assert budget_of(tmp_path / "elsewhere" / "report.html") is None


def test_a_stage_that_started_nothing_says_what_it_needed_and_the_budget(
        tmp_path: Path) -> None:
    """run.json's `unpaid` (diagnose.run): the first screen's note under a stage not measured
    names what its start needed at the run's pace, what it had and the --budget that pays."""
    from scalelab.lab.report.screen import budget_of, unpaid_note

    (tmp_path / "run.json").write_text(json.dumps({
        "budget": {"total_s": 260.0, "stages": [
            {"stage": "llm", "minimum_s": 40.0, "sized": True}]},
        "unpaid": {"llm": {"need_s": 52.5, "left_s": 20.0, "budget_s": 390.0},
                   "serve": {"need_s": 56.0, "left_s": 0.0, "budget_s": 86.0,
                             "input": "features"}}}))
    got = budget_of(tmp_path / "report.html")
    assert got is not None and got.unpaid == {
        "llm": "llm: not measured: needs ~52.5 s, had 20 s; about --budget 6m30s would pay it",
        "serve": "serve: not measured: input features needs ~56 s, had none left; about "
                 "--budget 1m30s would pay it"}
    assert unpaid_note("online", {"need_s": 44.0}) == "online: not measured: needs ~44 s"
    assert unpaid_note("train", {"stopped_s": 9.84, "input": "features"}) == (
        "train: not measured: input features stopped at its deadline after 9.84 s")
    v = StageVerdict(stage="llm", target_multiple=10.0, measured=False)
    assert screen_line(v, budget=got).notes == (got.unpaid["llm"],)
    assert screen_line(v).notes == ()
