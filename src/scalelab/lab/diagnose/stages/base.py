"""The stage interface of `scalelab diagnose`, and the context a stage runs its steps in.

A stage is one module in this package: its settings (a section of `scalelab.yaml`), the
measured steps it runs (each a `scalelab` command in its own process, writing records), the
goals the verdict judges it by (objectives, the baseline series, its advisor) and how its
records are tagged. Shared inputs several stages read (the flights features, a trained model
repository) are `Artifact`s, built once on first request.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import StageGoal
from scalelab.lab.diagnose.budget import Plan, Work, budget_text, plan_parts
from scalelab.lab.diagnose.schema import Prices
from scalelab.lab.diagnose.steps import Step, StepResult

S = TypeVar("S")

DEFAULT_MINIMUM_S = 20.0
"""A stage's minimum seconds when it has no estimate of its own."""
MINIMUM_S = {"data": 8.0, "train": 24.0, "llm": 40.0, "model": 7.0, "retrieval": 60.0,
             "online": 16.0}
"""Seconds each fixed stage's default work took per repeat on a 2-core machine: what --budget
sets aside for it before sharing out the rest. A busy host takes longer; the sized stages'
spare time pays for it. data, train, model, online: the stage times of a fresh clone's
`make demo` on a quiet 2-core VM (2026-12-03 11:38–11:44 UTC, load 0.5–1.4; the Time
section's "spent"), each stage's fixed work whole (none is sized). retrieval: its bench's
fixed work after the cuts of 2026-12-03 (docs/diagnose-stages.md),
estimated for a quiet machine from CPU seconds measured at load 14–20. data: its scales now
share their generated files (data.generate.Written): 8.7 s in a whole demo at load 1.7–3.7
(2026-12-03 15:25 UTC; 11.9 s before, at 1.5–4.6), so 8 s is again what it takes."""



ESTIMATE_MARGIN = 1.1
"""A fixed stage whose share is within this factor of what its decision needs still starts:
its estimate is a quiet one times a pace and misses by tens of percent either way, and its
deadline stops it in time (the demo's online stage at 11.7 s of 11.8 needed, on a quiet
2-core VM, 2026-12-07, was otherwise not measured at all)."""

class WholeConfig(Protocol):
    """What a stage reads of the whole objectives file (diagnose.config.DiagnoseConfig is one):
    a protocol, because the config's `stages:` section is built from the stages."""

    @property
    def stages(self) -> Any: ...

    @property
    def custom(self) -> Any: ...


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """A shared input built by steps of its own, once per diagnosis, on first request."""

    name: str
    steps: int
    """How many steps building it takes (for the progress bar)."""
    build: Callable[[Context], Path | None]
    """Runs the steps through the context; None when a step failed."""
    needs: tuple[Artifact, ...] = ()
    minimum_s: float = 0.0
    """Its steps' seconds on a quiet 2-core machine: added to the minimum of the first
    enabled stage that needs it, whose time builds it (`Runner.plan_budget`)."""


@dataclass(kw_only=True)
class Context:
    """What a stage sees while it runs: where to write, the shared settings, how to run a step."""

    work: Path
    """Work files of the whole diagnosis (datasets, repositories, step records)."""
    logs: Path
    repeats: int
    prices: Prices
    settings: dict[str, Any]
    """Every stage's validated settings by stage name (an artifact may read another's)."""
    run: Callable[[Step], StepResult]
    """Run one measured step (progress, logs, records tagged and appended)."""
    fail: Callable[[Step, str], StepResult]
    """Record a step that could not start (e.g. its server never became ready)."""
    keep: Callable[[list[Record]], None] = lambda records: None
    """Append records the stage built itself (a sized level's merged chunks) to the run's."""
    shares: dict[str, float] = field(default_factory=dict)
    """Each stage's share of the --budget in seconds (diagnose.budget); empty: no budget."""
    full: bool = False
    """--full: a sized level runs until decided, up to its stage's cap per level."""
    prometheus: str | None = None
    """`prometheus:` of the config: asked for the series behind the user's endpoints."""
    short: set[str] = field(default_factory=set)
    """Stages whose share, as they started, was under their minimum at the pace the machine
    delivered so far (`Runner._reshare`): each cuts its work to what its decision needs (its
    curve points, candidate series and replica sweep go)."""
    notes: list[str] = field(default_factory=list)
    """What a stage left out for lack of time and why (run.json's `notes`), e.g. the replica
    sweep its share could not pay for."""
    share_s: float | None = None
    """The running stage's share as it started (`Runner._reshare`), fixed stages too; None:
    no budget."""
    deadline: float | None = None
    """When the running stage's share ends (`time.monotonic`); None: no budget. A step still
    running then is stopped and its level marked not measured (`Runner._run`)."""
    pace: float = 1.0
    """How much slower than the quiet estimates the machine delivered so far (budget.pace):
    what a fixed stage multiplies its estimates by to cut its work to its share."""
    budget_for: Callable[[str, float], float | None] = lambda stage, more_s: None
    """The --budget that gives a stage `more_s` more seconds (`budget.budget_paying`, set by
    the runner); None: no budget."""
    unpaid_by: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Stage or shared input -> what its start needed and had (`unpaid`): run.json's
    `unpaid`, which the first screen reads (report.screen)."""
    _built: dict[str, Path | None] = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def unpaid(self, stage: str, quiet_s: float) -> str | None:
        """Why `quiet_s` seconds of work (a quiet 2-core estimate) cannot start now: at this
        run's pace it needs more than is left before the running stage's deadline; the text
        names both and the --budget that would pay it (`budget_for`). None: it fits, or no
        budget."""
        left = self.left_s()
        need = quiet_s * self.pace
        if left is None or need <= left:
            return None
        more = self.budget_for(stage, need - max(0.0, left))
        self.unpaid_by[stage] = {"need_s": round(need, 1), "left_s": round(max(0.0, left), 1),
                                 "budget_s": more}
        pays = "a larger --budget" if more is None else f"about --budget {budget_text(more)}"
        return (f"needs ~{need:.3g} s at this run's pace ({self.pace:.3g}× the quiet "
                f"estimate of {quiet_s:.3g} s), {max(0.0, left):.3g} s were left before its "
                f"deadline; {pays} would pay it")

    def unpaid_start(self, stage: str, what: str, quiet_s: float) -> bool:
        """Whether a sized stage's share cannot pay `what` (starting its servers, building its
        corpus) and its target's first decision chunk, `quiet_s` quiet seconds together:
        then it starts nothing, which its deadline would stop before it measured anything,
        and says so (`unpaid`)."""
        why = self.unpaid(stage, quiet_s)
        if why is not None:
            self.note(f"{stage}: not measured: {what} and its target's first chunk {why}")
        return why is not None

    def left_s(self) -> float | None:
        """Seconds left of the running stage's share; None: no budget."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def records(self, name: str) -> Path:
        """A fresh file for one step's records."""
        p = self.work / "records" / f"{name}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.unlink(missing_ok=True)
        return p

    def provide(self, a: Artifact, path: Path | None) -> None:
        """Use `path` as `a` instead of building it (an input made elsewhere, e.g. a test's
        small model repository); None: the artifact is absent."""
        self._built[a.name] = path

    def has(self, a: Artifact) -> bool:
        """Whether `a` was built or provided (absent included) already."""
        return a.name in self._built

    def artifact(self, a: Artifact) -> Path | None:
        if a.name not in self._built:
            for dep in a.needs:
                self.artifact(dep)
            self._built[a.name] = a.build(self)
        return self._built[a.name]


class Stage(ABC, Generic[S]):
    """One stage of a diagnosis. Subclass it in a module of its own and list it in
    `diagnose.stages.STAGES`; its settings class becomes the `stages.<name>` section."""

    name: ClassVar[str]
    """The stage's name in records, the sheet, the verdict and `stages.<name>`."""
    settings: ClassVar[type[BaseModel]]
    """The pydantic model of its section (a `StageSettings`); defaults from `defaults.yaml`."""

    section: ClassVar[bool] = True
    """Whether its settings are the `stages.<name>` section (False: the stage reads its own
    top-level key, like `custom:`)."""

    def of(self, cfg: WholeConfig) -> S:
        """This stage's settings out of the whole config."""
        value: S = getattr(cfg.stages, self.name)
        return value

    def enabled(self, s: S) -> bool:
        return bool(getattr(s, "enabled", True))

    sized: ClassVar[bool] = False
    """Whether its levels are sized sequentially (diagnose.sizing): more time, more decided."""

    def is_sized(self, s: S) -> bool:
        """Whether these settings' levels are sized (default: the class's `sized`)."""
        return self.sized

    def minimum_s(self, s: S, repeats: int) -> float:
        """Seconds its fixed work takes on a 2-core machine (start-up, the steps it always
        runs, one chunk a level): what --budget gives it before sharing out the rest."""
        return MINIMUM_S.get(self.name, DEFAULT_MINIMUM_S)

    def least_s(self, s: S, repeats: int) -> float:
        """Seconds the least of its work its decision needs takes on a 2-core machine (a
        fixed stage with its curve points and candidates cut, `budget.plan_parts`): a budget
        under its minimum cuts it toward this. Default: its minimum (nothing to cut)."""
        return self.minimum_s(s, repeats)

    def needs(self, s: S) -> tuple[Artifact, ...]:
        """Shared inputs the stage reads (built before it runs, counted for progress)."""
        return ()

    @abstractmethod
    def count(self, s: S, repeats: int) -> int:
        """How many steps `run` will take (for the progress bar)."""

    @abstractmethod
    def run(self, s: S, ctx: Context) -> None:
        """Run the stage's measured steps through `ctx.run`."""

    @abstractmethod
    def goals(self, s: S) -> list[StageGoal]:
        """What the verdict judges: objectives, baseline series, target and advisor."""

    def stage_names(self, s: S) -> list[str]:
        """The names its rows and goals carry (the custom set: one per user stage)."""
        return [self.name]

    def limits(self, s: S, rows: list[SheetRow], *, cores: int) -> list[Evidence]:
        """Limits the stage's own recorded signals or settings show in its baseline rows (the
        engine's batch slots, more workers than `cores`), each citing its numbers; they lead
        the stage's limiting lines (diagnose.evidence). Default: none beyond the verdict's."""
        return []


class FixedStage(Stage[S]):
    """A stage whose levels are not sized: its default work is parts (levels, policies,
    variants) with quiet costs (`work`), and it runs what its share pays for at the pace the
    machine delivered so far (`plan`): the parts its decision needs always, the curve points
    and candidates while they fit, each cut said in the report's Time section."""

    @abstractmethod
    def work(self, s: S, repeats: int) -> Work:
        """Its default work's parts, in the order they run, each with its quiet cost."""

    def minimum_s(self, s: S, repeats: int) -> float:
        return self.work(s, repeats).whole_s

    def least_s(self, s: S, repeats: int) -> float:
        return self.work(s, repeats).least_s

    def plan(self, s: S, ctx: Context) -> Plan:
        """What it runs of its work in its share (`budget.plan_parts`); the cut is noted."""
        plan = plan_parts(self.work(s, ctx.repeats), share_s=ctx.share_s, slow=ctx.pace)
        note = plan.note(self.name)
        if note is not None:
            ctx.note(note)
        return plan

    def hopeless(self, ctx: Context, estimate_s: float) -> bool:
        """Whether its share cannot pay for even what its decision needs (`estimate_s` quiet
        seconds at the pace so far): then it starts nothing, which its deadline would stop
        unfinished, and leaves the time to the stages after it; noted."""
        if ctx.share_s is None or estimate_s * ctx.pace <= ctx.share_s * ESTIMATE_MARGIN:
            return False
        if ctx.deadline is not None and estimate_s * ctx.pace <= ctx.deadline - time.monotonic():
            return False  # its deadline lets it overrun its share (`budget.stage_deadline`)
        left = max(0.0, ctx.left_s() or 0.0)
        more = ctx.budget_for(self.name, estimate_s * ctx.pace - left)
        ctx.unpaid_by[self.name] = {"need_s": round(estimate_s * ctx.pace, 1),
                                    "left_s": round(left, 1), "budget_s": more}
        pays = "a larger --budget" if more is None else f"about --budget {budget_text(more)}"
        ctx.note(f"{self.name}: not measured: its {ctx.share_s:.3g} s share at this run's pace "
                 f"({ctx.pace:.3g}× the quiet estimates) pays for less than its decision needs "
                 f"(~{estimate_s * ctx.pace:.3g} s); {pays} would measure it")
        return True
