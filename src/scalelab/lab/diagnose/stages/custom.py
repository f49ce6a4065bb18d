"""The user's own stages (`custom:` in scalelab.yaml): a command to sweep or an endpoint to load.

`kind: sweep` runs `scalelab sweep` over the command (your pipeline over growing inputs, your
trainer over growing workers), which measures the command's whole process tree; `kind: load`
runs the open-loop load generator at `levels × base_rate`. Each custom stage is a stage of its
own in the sheet and the verdict, advised from its measured signals (core's generic advice).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field, RootModel, model_validator

from scalelab.lab.core.knee import find_knee
from scalelab.lab.core.objectives import Objective, slo_text
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.units import parse_duration
from scalelab.lab.core.verdict import Advice, AdviceInput, StageGoal, generic_advice
from scalelab.lab.diagnose.commands import Command, LoadCapacity, LoadRun, Sweep
from scalelab.lab.diagnose.schema import (
    Duration,
    EndpointAccess,
    HttpUrl,
    Levels,
    ObjectiveSpec,
)
from scalelab.lab.diagnose.stages.base import DEFAULT_MINIMUM_S, Context, Stage, WholeConfig
from scalelab.lab.diagnose.stages.endpoint import (
    grid_start,
    metrics_note,
    metrics_url,
    noted,
    sized_by,
    with_availability,
    with_notes,
)
from scalelab.lab.diagnose.stages.serve import CAPACITY_SEARCH_S
from scalelab.lab.diagnose.stages.serve import advise as serve_advice
from scalelab.lab.diagnose.stages.serve_curve import (
    CAPACITY,
    search_requests,
    step_seconds,
)
from scalelab.lab.diagnose.stages.serve_search import confirm_length, search_budget
from scalelab.lab.diagnose.stages.sized_load import least_s, sized_levels
from scalelab.lab.diagnose.steps import Step, restage


class CustomStage(EndpointAccess):
    """A stage of the user's own system: a command to sweep (your pipeline, trainer or job over
    growing inputs or workers) or an HTTP endpoint to load."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    """The stage's name in the sheet and the verdict."""
    kind: Literal["sweep", "load"]
    """sweep: run a command per level; load: load an HTTP endpoint per level."""
    command: list[str] | None = None
    """kind=sweep: the command, with {VAR} where the level goes."""
    var: str = "workers"
    """kind=sweep: the variable's name (in the records and in {VAR})."""
    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """The levels of the variable (kind=load: multiples of base_rate)."""
    metric: str | None = None
    """kind=sweep: a rate the command prints ('json:KEY' or a regex); default 1/wall time."""
    url: HttpUrl | None = None
    """kind=load: the URL to load (open loop, rates = levels × base_rate)."""
    server_pid: int | None = Field(default=None, ge=1)
    """kind=load: the local process serving it, whose CPU, memory and threads are read each
    level (default: the process listening on the URL's port when it is on this machine)."""
    body: str | None = None
    """kind=load: a JSON file POSTed as each request's body (default: GET)."""
    base_rate: float = 10.0
    """kind=load: requests/s at level 1."""
    duration: Duration = "3s"
    """kind=load: measured time per level."""
    capacity: bool = True
    """kind=load: also search the highest rate meeting the latency objective (`scalelab load
    capacity`, as the serve stage does); the replica advice divides the peak by it."""
    capacity_max_steps: int = Field(default=8, ge=2, le=40)
    """kind=load: bound on the capacity search's steps."""
    capacity_step: Duration = "2s"
    """kind=load: shortest "longest capacity step" (raised until the first rate can reach the
    requests the step rule needs)."""
    target_multiple: float = 10.0
    """The multiple of the smallest level the stage must reach."""
    objectives: list[ObjectiveSpec] = Field(default_factory=list)
    """What the stage must keep (see the objective metrics)."""

    def built(self) -> list[Objective]:
        """The stage's objectives; a load stage's with availability (99% by default)."""
        objectives = [o.build() for o in self.objectives]
        return with_availability(objectives) if self.kind == "load" else objectives

    @model_validator(mode="after")
    def _kind_needs(self) -> CustomStage:
        if self.kind == "sweep" and not self.command:
            raise ValueError(f"kind sweep needs command: the command to run per level, with "
                             f"{{{self.var}}} where the level goes")
        if self.kind == "load" and not self.url:
            raise ValueError("kind load needs url: the HTTP endpoint to load, e.g. "
                             "http://127.0.0.1:8000/predict")
        if self.body is not None and not Path(self.body).is_file():
            raise ValueError(f"body {self.body!r} is not a file; give a JSON file to POST")
        return self


class CustomStages(RootModel[list[CustomStage]]):
    """The `custom:` list (config.DiagnoseConfig checks its names against the built-in
    stages')."""

    @model_validator(mode="after")
    def _names(self) -> CustomStages:
        names = [c.name for c in self.root]
        for n in names:
            if names.count(n) > 1:
                raise ValueError(f"two custom stages are named {n!r}; give each its own name")
        return self


LOAD = "load"
"""The series of a load stage's levels ("load capacity": its capacity search's steps)."""


def _search(c: CustomStage, rec: Path, start: float | None = None) -> LoadCapacity | None:
    """kind=load with `capacity` and a latency objective: the capacity search's command."""
    objectives = c.built()
    slo = slo_text(objectives)
    if c.kind != "load" or not c.capacity or slo is None:
        return None
    first = start or c.base_rate
    floor_s = parse_duration(c.capacity_step)
    step_s = step_seconds(search_requests(objectives, availability=False), first, floor_s)
    # The availability objective (99% where none is named) goes in with the latency term: a
    # rate whose answers fail past it is never a capacity.
    return LoadCapacity(url=c.url or "", slo=slo, start=first,
                        header=c.header_flags(), api_key_env=c.api_key_env,
                        max_rate=c.base_rate * max(c.levels) * 20, min_step=f"{floor_s / 2:g}s",
                        max_step=f"{step_s:g}s", max_steps=c.capacity_max_steps, warmup="0.5s",
                        records=rec, confirm=confirm_length(c.capacity_step),
                        payload="json" if c.body else None,
                        body=Path(c.body) if c.body else None)


def _command(c: CustomStage, repeats: int, rec: Path, prometheus: str | None = None) -> Command:
    if c.kind == "sweep":
        levels = ",".join(f"{v:g}" for v in c.levels)
        return Sweep(var=f"{c.var}={levels}", repeats=repeats, metric=c.metric, records=rec,
                     command=list(c.command or []))
    return LoadRun(url=c.url or "", rates=[c.base_rate * lv for lv in c.levels],
                   duration=c.duration, arrival="constant", records=rec,
                   header=c.header_flags(), api_key_env=c.api_key_env,
                   payload="json" if c.body else None, body=Path(c.body) if c.body else None,
                   server_signals=True, server_pid=c.server_pid, prometheus=prometheus)


def _tag(r: Record, *, stage: str, kind: str, note: str | None = None) -> Record:
    """The user's stage name; recovery is the user's own, which the diagnosis cannot see."""
    return noted(restage(r, stage=stage).model_copy(
        update={"recovery": r.recovery if kind == "sweep" and r.recovery else "none known"}
    ), note=note)


def sweep_knee(rows: list[SheetRow]) -> str:
    """The knee `scalelab sweep` reports (Kneedle on the median rate per level), said in the
    verdict: where more of the variable starts buying less; '' under three levels."""
    pts = sorted((r.level, r.rate) for r in rows if r.rate is not None)
    if len({x for x, _ in pts}) < 3:
        return ""
    knee = find_knee([x for x, _ in pts], [y for _, y in pts], curve="concave")
    var, unit = rows[0].variable, rows[0].rate_unit or "units/s"
    if knee is None:
        return (f"no knee in the rate over {var} {pts[0][0]:g} to {pts[-1][0]:g} (Kneedle, "
                "as scalelab sweep finds it): it still grows in proportion there")
    rate = dict(pts)[knee]
    return (f"the rate curve bends at {var}={knee:g} ({rate:.4g} {unit}, measured; Kneedle, "
            f"the knee scalelab sweep reports): past it more {var} buy less")


def _advise(inp: AdviceInput) -> Advice:
    """Core's generic advice from the measured signals, the sweep's knee and the notes."""
    a = generic_advice(inp)
    knee = sweep_knee(inp.base)
    if knee:
        a = Advice(intervention=a.intervention,
                   predicted="; ".join(x for x in (a.predicted, knee) if x))
    return with_notes(a, inp.base)


class CustomStageSet(Stage[CustomStages]):
    """Every `custom:` entry, in the order written; each is judged as a stage of its own."""

    name = "custom"
    settings = CustomStages
    section = False

    def of(self, cfg: WholeConfig) -> CustomStages:
        value: CustomStages = cfg.custom
        return value

    def enabled(self, s: CustomStages) -> bool:
        return bool(s.root)

    def is_sized(self, s: CustomStages) -> bool:
        return any(c.kind == "load" for c in s.root)

    def minimum_s(self, s: CustomStages, repeats: int) -> float:
        total = 0.0
        for c in s.root:
            cmd = _command(c, repeats, Path("-"))
            total += (least_s(cmd, len(c.levels)) + (CAPACITY_SEARCH_S if c.capacity else 0.0)
                      if isinstance(cmd, LoadRun) else DEFAULT_MINIMUM_S)
        return total

    def count(self, s: CustomStages, repeats: int) -> int:
        # one step a sweep, one chunk a load level at least, one step a capacity search
        return sum(len(c.levels) if c.kind == "load" else 1 for c in s.root) + \
            sum(1 for c in s.root if _search(c, Path("-")) is not None)

    def run(self, s: CustomStages, ctx: Context) -> None:
        for c in s.root:
            rec = ctx.records(f"custom-{c.name}")
            note = metrics_note(metrics_url(c.url)) if c.kind == "load" and c.url else None
            tag = functools.partial(_tag, stage=c.name, kind=c.kind, note=note)
            command = _command(c, ctx.repeats, rec, ctx.prometheus)
            if isinstance(command, LoadRun):
                # each level sized until its objectives are decided (diagnose.sizing)
                ok = sized_levels(ctx, budget_key=self.name, stage=c.name, label=c.name,
                                  cmd=command, objectives=sized_by(c.built()),
                                  series=LOAD, tag=tag, rec=rec,
                                  reserve_s=CAPACITY_SEARCH_S if c.capacity else 0.0)
            else:
                ok = ctx.run(Step(stage=c.name, label=f"{c.name} ({c.kind})", command=command,
                                  records=rec, tag=tag, series=None, timeout_s=3600)).ok
            cap = ctx.records(f"custom-{c.name}-capacity")
            search = _search(c, cap, grid_start(rec, c.built(), c.base_rate))
            if search is not None and ok:
                search = replace(search, budget=search_budget(ctx))
                ctx.run(Step(stage=c.name, label=f"{c.name} capacity", command=search,
                             records=cap, tag=tag, series=LOAD + CAPACITY, timeout_s=900))

    def stage_names(self, s: CustomStages) -> list[str]:
        return [c.name for c in s.root]

    def goals(self, s: CustomStages) -> list[StageGoal]:
        return [
            StageGoal(stage=c.name, objectives=c.built(),
                      target_multiple=c.target_multiple,
                      baseline_series=LOAD if c.kind == "load" else "",
                      advisor=serve_advice if c.kind == "load" else _advise)
            for c in s.root
        ]


STAGE = CustomStageSet()
