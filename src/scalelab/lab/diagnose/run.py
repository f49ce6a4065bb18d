"""The main job: run every enabled stage's steps with progress, then judge and report once.

The stages and their order come from `diagnose.stages.STAGES`; each stage runs its own steps
(each a `scalelab` command in its own process, writing records) through a `Context`. The shared
inputs stages need (features, a trained model) are built once, on first request. Ctrl-C stops
the current step and still writes the report from what was measured.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import psutil
import yaml

from scalelab.lab.core.jsonfile import read_json_object
from scalelab.lab.core.machine import Machine, current_machine
from scalelab.lab.core.records import Record, append_records, new_experiment_id, read_records
from scalelab.lab.core.sheet import SheetRow, build_sheet
from scalelab.lab.core.verdict import Verdict, judge
from scalelab.lab.diagnose.budget import (
    Share,
    StageNeed,
    budget_paying,
    least_at,
    pace,
    parse_budget,
    replan,
    split_budget,
    stage_deadline,
    time_lines,
)
from scalelab.lab.diagnose.config import CONFIG, DiagnoseConfig, Mode
from scalelab.lab.diagnose.energy import energy_tagger
from scalelab.lab.diagnose.evidence import stage_limits
from scalelab.lab.diagnose.failures import stage_failures
from scalelab.lab.diagnose.goals import stage_goals
from scalelab.lab.diagnose.stages import STAGES
from scalelab.lab.diagnose.stages.base import Artifact, Context, Stage
from scalelab.lab.diagnose.steps import Step, StepResult, run_step
from scalelab.lab.report.document import ReportFiles, write_report

RECORDS = "records.jsonl"
RUN_INFO = "run.json"
"""What the run itself knows beyond the records: its experiment id, failed steps, Ctrl-C."""
REPORT_S = 6.0
"""Seconds the budget keeps for after the last stage: the report built from the records
(sheet, verdict, report.md/html/json) and printed, on a quiet machine (times the pace the
machine delivered, `Runner._reshare`). The whole time outside the stages (interpreter start,
imports and the report) was 10.5, 16.0 and 12.4 s in three demo runs at load 7–12 on the
shared 2-core VM (2026-12-07, wall less the stages' spent seconds); the start-up is inside the
budget's clock already (`process_started`)."""
STARTUP_S = 2.5
"""The diagnose process's start (interpreter and imports) up to its first stage on a quiet
2-core machine (2.0–2.2 s measured, docs/diagnose.md): the first measure of the pace, so the
first stage is planned at the machine's speed too."""
DEADLINE_SLACK = 1.5
"""A stage is stopped at this multiple of its share, and at the budget's end (less the
report's time) at the latest: its share is what it plans to, from quiet estimates times a
measured pace, which miss by tens of percent (the train stage planned to its 35 s share at
pace 2.94 ran past it at load 10–17, 2026-12-07, and a stop at the share itself lost its one
step); what it takes beyond its share the stages after it give up, re-planned as each starts."""
START_LEAST_S = 1.0
"""A step is not started with less of its stage's share left: a `scalelab` process takes
about that long to import before it measures anything."""


STARTUP_AGE_S = 30.0
"""A process older than this when diagnose starts is a host calling it in-process (a test
suite, a notebook), not `scalelab diagnose` starting: its budget counts from now."""


def process_started() -> float:
    """This process's start on the `time.monotonic` clock: what a budget counts from, so the
    interpreter's start and the imports are inside it (the user waits for them too); now for a
    process older than `STARTUP_AGE_S` (a suite's worker that ran for minutes had otherwise
    spent the budget before the first stage)."""
    age = max(0.0, time.time() - psutil.Process().create_time())
    return time.monotonic() - (age if age <= STARTUP_AGE_S else 0.0)


@dataclass(kw_only=True)
class Diagnosis:
    """One diagnosis as it ran: its steps, and the report written from its records."""

    out: Path
    experiment: str
    steps: list[StepResult] = field(default_factory=list)
    interrupted: bool = False
    sheet: list[SheetRow] = field(default_factory=list)
    verdict: Verdict | None = None
    files: ReportFiles | None = None
    failures: dict[str, str] = field(default_factory=dict)
    """Stage -> why it failed (diagnose.failures): a failed run of the system under test."""


Progress = Callable[[str, int, int], None]
"""(label of the step starting, index, total) — the CLI draws the bar."""


def on_cluster(step: Step, address: str | None) -> Step:
    """The step with its load generators (or sweep commands) on the `client.cluster` workers;
    every other step, and every step without a cluster, unchanged."""
    cmd = step.command
    if address is None or cmd is None or "cluster" not in {f.name for f in fields(cmd)}:
        return step
    return replace(step, command=replace(cmd, cluster=address))  # type: ignore[call-arg]


class Runner:
    """Plans and runs the steps of one diagnosis into OUT (records, logs, work files, report)."""

    def __init__(
        self, cfg: DiagnoseConfig, out: Path, mode: Mode, progress: Progress | None = None,
        budget_s: float | None = None, started: float | None = None,
    ) -> None:
        """`budget_s`: the --budget in seconds; None: the config's `budget` (none in --full).
        `started`: when the budget's clock started (`time.monotonic`; the CLI passes
        `process_started()`); None: now."""
        self.started = time.monotonic() if started is None else started
        self.cfg, self.out, self.mode = cfg, out, mode
        if budget_s is None and cfg.budget is not None and mode != "full":
            budget_s = parse_budget(cfg.budget, what="budget")
        self.budget_s = budget_s
        self.shares = self.plan_budget()
        self.sink = out / RECORDS
        self.progress = progress
        self.diagnosis = Diagnosis(out=out, experiment=new_experiment_id("diagnose"))
        self._n = 0
        self._total = 0
        self.ctx = Context(
            work=out / "work",
            logs=out / "logs",
            repeats=cfg.repeats,
            prices=cfg.prices,
            settings={st.name: st.of(cfg) for st in STAGES},
            run=self._run,
            fail=self._fail,
            keep=self._keep,
            shares={sh.stage: sh.share_s for sh in self.shares if sh.sized},
            full=mode == "full",
            prometheus=cfg.prometheus,
            budget_for=self._budget_for,
        )
        self.unbuilt: dict[str, str] = {}
        """Shared input -> why it was not built for lack of time (`_skip_input`)."""
        self.spent: dict[str, float] = {}
        self.given: dict[str, float] = {}
        """Each stage's (and shared input's) share as it started (`_reshare`)."""
        self.paces: dict[str, float] = {}
        """The pace each stage's share was planned at (`_reshare`)."""
        self.delivered: list[tuple[float, float]] = []
        """(quiet estimate, wall seconds) of each step that said what it expected and ran to
        its end, and of the process's start: the pace the machine delivers (`budget.pace`)."""

    def run_order(self) -> list[tuple[Artifact | None, Stage[Any]]]:
        """What runs, in order: each enabled stage, after the shared inputs it is the first
        to need (each as `(artifact, stage)`; the stage itself as `(None, stage)`)."""
        seen: set[str] = set()
        out: list[tuple[Artifact | None, Stage[Any]]] = []

        def add(a: Artifact, st: Stage[Any]) -> None:
            for dep in a.needs:
                add(dep, st)
            if a.name not in seen:
                seen.add(a.name)
                out.append((a, st))

        for st in STAGES:
            s = st.of(self.cfg)
            if st.enabled(s):
                for a in st.needs(s):
                    add(a, st)
                out.append((None, st))
        return out

    def plan_budget(self) -> list[Share]:
        """The shares of the budget (diagnose.budget) of the enabled stages and of the shared
        inputs they need (each a fixed line of its own, before the first stage needing it,
        so a stage's share is its own work); [] without one. Bad usage (before anything
        runs) when the budget is under their minimums."""
        if self.budget_s is None:
            return []
        needs = [StageNeed(stage=a.name, minimum_s=a.minimum_s, sized=False) if a is not None
                 else StageNeed(stage=st.name,
                                minimum_s=st.minimum_s(st.of(self.cfg), self.cfg.repeats),
                                sized=st.is_sized(st.of(self.cfg)),
                                least_s=st.least_s(st.of(self.cfg), self.cfg.repeats))
                 for a, st in self.run_order()]
        return split_budget(self.budget_s, needs)

    def _run(self, step: Step) -> StepResult:
        self._n += 1
        self._total = max(self._total, self._n)  # a sized level's extra chunks
        step = on_cluster(step, self.cfg.client.cluster)
        if self.progress:
            self.progress(step.label, self._n, self._total)
        left = self.ctx.left_s()
        if left is not None and left < START_LEAST_S:
            res = StepResult(step=step, ok=False, returncode=None, wall_s=0.0, cut=(
                f"not started: {max(0.0, left):.3g} s of its stage's {self.ctx.share_s:.3g} s "
                "share were left"))
        else:
            res = run_step(
                energy_tagger(step, self.cfg.prices), logs=self.ctx.logs,
                experiment=self.diagnosis.experiment, sink=self.sink, stop_at=self.ctx.deadline
            )
        if res.cut is not None:
            done = ", its levels written before kept" if res.records else ""
            self.ctx.note(f"{step.stage}: {step.label}: not measured{done}: {res.cut}")
        elif res.ok and step.estimate_s:
            self.delivered.append((step.estimate_s, res.wall_s))
        self.diagnosis.steps.append(res)
        return res

    def _keep(self, records: list[Record]) -> None:
        append_records(self.sink, records)

    def _fail(self, step: Step, error: str) -> StepResult:
        res = StepResult(step=step, ok=False, returncode=None, wall_s=0.0, error=error)
        self.diagnosis.steps.append(res)
        return res

    def plan_size(self) -> int:
        """Steps of every enabled stage plus those of the shared inputs they need, once each."""
        n = 0
        artifacts: dict[str, Artifact] = {}

        def add(a: Artifact) -> None:
            for dep in a.needs:
                add(dep)
            artifacts[a.name] = a

        for st in STAGES:
            s = st.of(self.cfg)
            if st.enabled(s):
                n += st.count(s, self.cfg.repeats)
                for a in st.needs(s):
                    add(a)
        return n + sum(a.steps for a in artifacts.values())

    def run(self) -> Diagnosis:
        self.out.mkdir(parents=True, exist_ok=True)
        self.sink.write_text("", encoding="utf-8")  # a results dir is always rebuildable
        (self.out / CONFIG).write_text(
            yaml.safe_dump(
                {"mode": self.mode, **self.cfg.model_dump(mode="json")},
                sort_keys=False,
                allow_unicode=True,
            ),
            "utf-8",
        )
        self._total = self.plan_size()
        # The process's start is the first thing the machine delivered: its pace plans the
        # first stage.
        self.delivered.append((STARTUP_S, time.monotonic() - self.started))
        try:
            for a, st in self.run_order():
                s = st.of(self.cfg)
                name = st.name if a is None else a.name
                self._reshare(name)
                if (self._lacks_input(st, s) or self._out_of_time(name)) if a is None \
                        else self._skip_input(a):
                    self.spent[name] = 0.0
                    continue
                # A shared input is stopped at its deadline like a fixed stage: the stages
                # needing it then say it is missing (`_lacks_input`).
                t0, n0 = time.monotonic(), len(self.diagnosis.steps)
                try:
                    if a is None:
                        st.run(s, self.ctx)
                    elif self.ctx.artifact(a) is None:
                        cut = [r.cut for r in self.diagnosis.steps[n0:] if r.cut is not None]
                        if cut:
                            self.unbuilt[a.name] = cut[-1]
                            self.ctx.unpaid_by[a.name] = {
                                "stopped_s": round(time.monotonic() - t0, 1)}
                finally:
                    self.spent[name] = time.monotonic() - t0
        except KeyboardInterrupt:
            self.diagnosis.interrupted = True
        self.ctx.deadline = None
        d = self.diagnosis
        info = {
            "experiment": d.experiment,
            "interrupted": d.interrupted,
            "budget": self.budget_report(),
            "notes": self.ctx.notes,
            "unpaid": self.ctx.unpaid_by,
            **steps_info(d.steps),
        }
        (self.out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n", "utf-8")
        d.sheet, d.verdict, d.files = rebuild(self.out, self.cfg, self.mode)
        d.failures = failures(self.out)
        return d


    def _reshare(self, stage: str) -> None:
        """A stage's share as it starts, re-planned from what the budget has left (less the
        report's `REPORT_S`) and the pace the machine delivered so far (`budget.replan`): an
        earlier overrun (a busy host) is shared by every stage still to run, each in
        proportion to its minimum, not paid by the last one alone. The pace is the slower of
        the stages' time against their shares and the steps' against their quiet estimates
        (a fixed stage that cut its work to its share hides a slow machine from the first).
        The stage's deadline (`Context.deadline`, `budget.stage_deadline`) is `DEADLINE_SLACK`
        times its share, bounded by the later stages' leasts and the budget's end: a step
        still running then is stopped. A shared input's deadline protects the leasts of the
        later stages that do not need it (`needing` names those that do: stopped, it leaves
        them nothing to measure, so they do not hold it back; `_needing`)."""
        names = [sh.stage for sh in self.shares]
        if self.budget_s is None or stage not in names:
            return
        i = names.index(stage)
        needs = [StageNeed(stage=sh.stage, minimum_s=sh.minimum_s, sized=sh.sized,
                           least_s=sh.least_s) for sh in self.shares]
        done = [(self.given.get(sh.stage, sh.minimum_s), self.spent[sh.stage])
                for sh in self.shares[:i] if sh.stage in self.spent]
        slow = max(pace(done), pace(self.delivered))
        now = time.monotonic()
        left = self.budget_s - (now - self.started) - REPORT_S * slow
        share = replan(left, needs[i], needs[i + 1:], slow=slow)
        if stage in self.ctx.shares:
            self.ctx.shares[stage] = share
        self.given[stage] = share
        self.paces[stage] = slow
        end = self.started + self.budget_s - REPORT_S * slow
        self.ctx.share_s, self.ctx.pace = share, slow
        needing = self._needing(stage)
        later_least = sum(least_at(n, slow) for n in needs[i + 1:] if n.stage not in needing)
        self.ctx.deadline = stage_deadline(now, share, end, later_least, sized=needs[i].sized,
                                           slack=DEADLINE_SLACK)
        if share < needs[i].minimum_s * slow:
            self.ctx.short.add(stage)

    def _out_of_time(self, stage: str) -> bool:
        """Whether a stage starting now has under `START_LEAST_S` before its deadline (a sized
        stage given no share): then it is not run at all, noted. Run, it started its servers
        before finding no step could start (the serve and llm stages, given 0 s at pace 4.9,
        spent 18 and 24 s so, and the demo ended 20 s past its budget, 2026-12-07, load 7–10
        with a CPU-bound process beside it)."""
        left = self.ctx.left_s()
        if left is None or left >= START_LEAST_S:
            return False
        self.ctx.note(f"{stage}: not measured: its {self.ctx.share_s or 0.0:.3g} s share at this "
                      f"run's pace ({self.ctx.pace:.3g}× the quiet estimates) left "
                      f"{max(0.0, left):.3g} s before its deadline, under the {START_LEAST_S:g} "
                      "s a step needs to start; a larger --budget measures it")
        return True

    def _budget_for(self, stage: str, more_s: float) -> float | None:
        """The --budget that gives `stage` `more_s` more seconds (`budget.budget_paying`): a
        sized stage gets its minimum's part of the sized stages' of any extra second (as the
        first screen's `RunBudget.deciding`), a fixed stage or shared input all of it."""
        if self.budget_s is None:
            return None
        sized = {sh.stage: sh.minimum_s for sh in self.shares if sh.sized}
        weight = sum(sized.values())
        part = sized[stage] / weight if stage in sized and weight > 0 else 1.0
        return budget_paying(self.budget_s, more_s, part)

    def _needing(self, name: str) -> frozenset[str]:
        """The stages and shared inputs that read the shared input `name` (each lists every
        input it reads); none for a stage."""
        return frozenset(st.name if b is None else b.name for b, st in self.run_order()
                         if any(x.name == name for x in
                                (st.needs(st.of(self.cfg)) if b is None else b.needs)))

    def _skip_input(self, a: Artifact) -> bool:
        """Whether a shared input is not built: an input of its was not, or its quiet
        estimate at this run's pace does not fit before its deadline (`Context.unpaid`);
        then the stages needing it are not run (`_lacks_input`), noted."""
        if self.ctx.has(a):
            return False  # provided (a test's small repository): nothing to build
        lost = [d.name for d in a.needs if d.name in self.unbuilt]
        why = (f"its input {lost[0]} was not built" if lost
               else self.ctx.unpaid(a.name, a.minimum_s))
        if why is None:
            return False
        self.ctx.provide(a, None)
        self.unbuilt[a.name] = why
        self.ctx.note(f"{a.name} (a shared input): not built: {why}")
        return True

    def _lacks_input(self, st: Stage[Any], s: Any) -> bool:
        """Whether a stage needs a shared input not built for lack of time: then it is not
        run, and says which input and what it needed."""
        lost = [a.name for a in st.needs(s) if a.name in self.unbuilt]
        if not lost:
            return False
        if lost[0] in self.ctx.unpaid_by:
            self.ctx.unpaid_by[st.name] = {**self.ctx.unpaid_by[lost[0]], "input": lost[0]}
        self.ctx.note(f"{st.name}: not measured: the shared input {lost[0]} did not fit "
                      f"({self.unbuilt[lost[0]]})")
        return True

    def budget_report(self) -> dict[str, Any]:
        """How the time was spent per stage, against its share when there was a budget."""
        shares = {sh.stage: sh for sh in self.shares}
        stages = []
        for name, spent in self.spent.items():
            row: dict[str, Any] = {"stage": name, "spent_s": round(spent, 1)}
            if name in shares:
                row |= {"minimum_s": round(shares[name].minimum_s, 1),
                        "share_s": round(shares[name].share_s, 1), "sized": shares[name].sized}
                if name in self.given:
                    row["given_s"] = round(self.given[name], 1)
                if name in self.paces:
                    row["pace"] = round(self.paces[name], 2)
            stages.append(row)
        out = {"total_s": self.budget_s, "full": self.mode == "full", "stages": stages}
        if self.budget_s is not None and self.delivered:
            out["startup_s"] = round(self.delivered[0][1], 1)
        return out


def steps_info(steps: list[StepResult]) -> dict[str, list[dict[str, Any]]]:
    """run.json's failed steps (each fails its stage, diagnose.failures) and the steps cut for
    lack of time (stopped at their stage's deadline, or never started): those measured what
    they could and are no failure of the system under test."""
    return {
        "failed_steps": [{"stage": r.step.stage, "step": r.step.label, "error": r.error}
                         for r in steps if not r.ok and r.cut is None],
        "cut_steps": [{"stage": r.step.stage, "step": r.step.label, "why": r.cut}
                      for r in steps if r.cut is not None],
    }


def _machine(records: list[Record]) -> Machine:
    """The machine the records were measured on (a report rebuilt elsewhere keeps it)."""
    if not records:
        return current_machine()
    m = records[0].machine
    return Machine(cores=m.cores, memory_bytes=m.memory_bytes, device=m.device,
                   hostname=m.hostname)


def rebuild(
    out: Path, cfg: DiagnoseConfig, mode: Mode
) -> tuple[list[SheetRow], Verdict, ReportFiles]:
    """Sheet, verdict and report from OUT's stored files: what `scalelab report OUT` calls.

    Reads records.jsonl (and run.json, when the run wrote one: its failed steps fail their
    stages, see diagnose.failures); the report's JSON document is what `scalelab diagnose
    --json` prints."""
    sink = out / RECORDS
    records = read_records(sink) if sink.exists() else []
    sheet = build_sheet(records)
    m = _machine(records)
    goals = stage_goals(cfg)
    run_info: dict[str, Any] = (
        read_json_object(out / RUN_INFO) if (out / RUN_INFO).is_file() else {}
    )
    failed = stage_failures(run_info, sheet)
    verdict = judge(goals, sheet, cores=m.cores, memory_bytes=m.memory_bytes,
                    stage_limits=stage_limits(goals, sheet, cfg, cores=m.cores), failures=failed)
    meta = {"mode": mode, "records": len(records),
            "time": time_lines(run_info.get("budget"), records)
            + [str(n) for n in run_info.get("notes") or []]}
    files = write_report(out, sheet, verdict, goals, m, meta,
                         run={**run_info, "failed_stages": failed}, records=records)
    return sheet, verdict, files


def failures(out: Path) -> dict[str, str]:
    """Stage -> why it failed, from OUT's run.json and records (what `rebuild` reported)."""
    doc = read_json_object(out / "report.json") if (out / "report.json").is_file() else {}
    got = doc.get("failed_stages") or {}
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}
