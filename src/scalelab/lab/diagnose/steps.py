"""Running one measured step: a `scalelab` subcommand in its own process, its records tagged.

Each step writes records to a file of its own; the runner tags them (experiment, series) and
appends them to the run's records.jsonl, so a failed or interrupted step never leaves a half
record behind and `scalelab report` can rebuild everything from that one file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.records import Record, append_records, read_records
from scalelab.lab.diagnose.commands import Command
from scalelab.layers.web.spawn import stop_group

Tagger = Callable[[Record], Record]


@dataclass(kw_only=True)
class Step:
    stage: str
    label: str
    """Short name for progress and logs, e.g. 'serve batching=on'."""
    command: Command | None
    """The `scalelab` command it runs (None: a step that could not start)."""
    records: Path | None = None
    """Where the step appends its records (fresh file per step)."""
    series: str | None = None
    timeout_s: float = 600.0
    tag: Tagger | None = None
    keep: bool = True
    """Append its records to the run's records (False: a chunk of a sized level, whose
    records the stage merges and appends itself, diagnose.sizing)."""
    estimate_s: float | None = None
    """What the stage expects it to take on a quiet 2-core machine: its wall time against
    this is the pace the machine delivers (budget.pace), which later shares are cut by."""


@dataclass(kw_only=True)
class StepResult:
    step: Step
    ok: bool
    returncode: int | None
    wall_s: float
    error: str | None = None
    records: list[Record] = field(default_factory=list)
    stdout_path: Path | None = None
    cut: str | None = None
    """Why the step was stopped, or never started, for lack of time (its stage's share of the
    budget spent): what it measured is kept, the rest is not measured, and it is no failure
    of the system under test."""


def based(tag: Tagger | None, base_level: float) -> Tagger:
    """`tag`, then the record's 1× level stated (`Record.base_level`): for a stage that
    measures its target before its curve, which its budget may cut."""
    def apply(r: Record) -> Record:
        return (tag(r) if tag else r).model_copy(update={"base_level": base_level})
    return apply


def restage(r: Record, stage: str, repeat: int | None = None) -> Record:
    """A step's record under the diagnosis's stage name (and repeat, for one-repeat steps)."""
    upd: dict[str, object] = {"stage": stage}
    if repeat is not None:
        upd["repeat"] = repeat
    return r.model_copy(update=upd)


def scalelab_cmd(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "scalelab", *argv]


def run_step(step: Step, *, logs: Path, experiment: str, sink: Path,
             stop_at: float | None = None) -> StepResult:
    """Run the step; tag and append its records to `sink`; never raises for a failed step.

    `stop_at` (`time.monotonic`): its stage's deadline; a step still running then is stopped
    like one past its own timeout, but as a cut (`StepResult.cut`), not a failure: the records
    it wrote before (a bench writing a level at a time) are kept."""
    logs.mkdir(parents=True, exist_ok=True)
    if step.command is None:
        raise ValueError(f"step {step.label!r} has no command to run")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in step.label)
    out_path, err_path = logs / f"{safe}.out", logs / f"{safe}.err"
    timeout = step.timeout_s
    by_deadline = stop_at is not None and stop_at - time.monotonic() < timeout
    if stop_at is not None and by_deadline:
        timeout = max(0.0, stop_at - time.monotonic())
    cut = None
    t0 = time.perf_counter()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            scalelab_cmd(step.command.to_argv()),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=timeout)
            error = None
        except subprocess.TimeoutExpired:
            # A step past its stage's deadline measured nothing more worth the budget: it is
            # stopped at once (SIGTERM, then SIGKILL after a second), where a step past its own
            # timeout gets time to end cleanly.
            stop_group(proc, grace_s=1.0 if by_deadline else 5.0)
            rc, error = None, None
            if by_deadline:
                cut = (f"stopped at its stage's deadline after {time.perf_counter() - t0:.3g} s "
                       "(the stage's share of the budget was spent)")
            else:
                error = f"timed out after {step.timeout_s:g} s"
        except KeyboardInterrupt:
            # The step runs in its own session, so Ctrl-C reached only us: pass it on (a step
            # stops what it started in sessions of its own, e.g. a sweep's command), then stop
            # whatever is left of its group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
            stop_group(proc, grace_s=2.0)
            raise
    wall = time.perf_counter() - t0
    missed = False
    if rc not in (0, None) and error is None and cut is None:
        tail = err_path.read_text("utf-8", errors="replace").strip().splitlines()
        # Exit 1 after "objective missed: ..." (`cli._gate.exit_if_missed`: e.g. a capacity
        # search whose answer did not hold its confirmation) measured a miss: the system
        # answered, so the step is not a failure to measure.
        missed = rc == 1 and bool(tail) and tail[-1].startswith("objective missed:")
        if not missed:
            error = f"exit {rc}: {tail[-1][:300] if tail else 'no message'} (log: {err_path})"
    recs: list[Record] = []
    if step.records is not None and step.records.exists():
        try:
            recs = read_records(step.records)
        except BadInputError as e:
            error = error or f"unreadable records: {e}"
        tagged = []
        for r in recs:
            series = r.series or (step.series if step.series is not None else "")
            r2 = r.model_copy(update={"experiment": experiment, "series": series})
            tagged.append(step.tag(r2) if step.tag else r2)
        recs = tagged
        if step.keep:
            append_records(sink, recs)
    return StepResult(
        step=step,
        ok=(rc == 0 or missed) and error is None and cut is None,
        returncode=rc,
        wall_s=wall,
        error=error,
        records=recs,
        stdout_path=out_path,
        cut=cut,
    )
