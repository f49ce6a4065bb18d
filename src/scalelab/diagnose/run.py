"""The main job: run every enabled stage's steps with progress, then judge and report once.

The stages and their order come from `diagnose.stages.STAGES`; each stage runs its own steps
(each a `scalelab` command in its own process, writing records) through a `Context`. The shared
inputs stages need (features, a trained model) are built once, on first request. Ctrl-C stops
the current step and still writes the report from what was measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from scalelab.core.jsonfile import read_json_object
from scalelab.core.machine import Machine, current_machine
from scalelab.core.records import Record, new_experiment_id, read_records
from scalelab.core.sheet import SheetRow, build_sheet
from scalelab.core.verdict import Verdict, judge
from scalelab.diagnose.config import DiagnoseConfig, Mode
from scalelab.diagnose.energy import energy_tagger
from scalelab.diagnose.goals import stage_goals
from scalelab.diagnose.stages import STAGES
from scalelab.diagnose.stages.base import Artifact, Context
from scalelab.diagnose.steps import Step, StepResult, run_step
from scalelab.report.document import ReportFiles, write_report

RECORDS = "records.jsonl"
CONFIG = "config.yaml"
RUN_INFO = "run.json"
"""What the run itself knows beyond the records: its experiment id, failed steps, Ctrl-C."""


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
        self, cfg: DiagnoseConfig, out: Path, mode: Mode, progress: Progress | None = None
    ) -> None:
        self.cfg, self.out, self.mode = cfg, out, mode
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
        )

    def _run(self, step: Step) -> StepResult:
        self._n += 1
        step = on_cluster(step, self.cfg.client.cluster)
        if self.progress:
            self.progress(step.label, self._n, self._total)
        res = run_step(
            energy_tagger(step, self.cfg.prices), logs=self.ctx.logs,
            experiment=self.diagnosis.experiment, sink=self.sink
        )
        self.diagnosis.steps.append(res)
        return res

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
        try:
            for st in STAGES:
                s = st.of(self.cfg)
                if st.enabled(s):
                    st.run(s, self.ctx)
        except KeyboardInterrupt:
            self.diagnosis.interrupted = True
        d = self.diagnosis
        info = {
            "experiment": d.experiment,
            "interrupted": d.interrupted,
            "failed_steps": [{"step": r.step.label, "error": r.error} for r in d.steps if not r.ok],
        }
        (self.out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n", "utf-8")
        d.sheet, d.verdict, d.files = rebuild(self.out, self.cfg, self.mode)
        return d


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

    Reads records.jsonl (and run.json, when the run wrote one); the report's JSON document is
    what `scalelab diagnose --json` prints."""
    sink = out / RECORDS
    records = read_records(sink) if sink.exists() else []
    sheet = build_sheet(records)
    m = _machine(records)
    goals = stage_goals(cfg)
    verdict = judge(goals, sheet, cores=m.cores, memory_bytes=m.memory_bytes)
    run_info: dict[str, Any] = (
        read_json_object(out / RUN_INFO) if (out / RUN_INFO).is_file() else {}
    )
    meta = {"mode": mode, "records": len(records)}
    files = write_report(out, sheet, verdict, goals, m, meta, run=run_info, records=records)
    return sheet, verdict, files
