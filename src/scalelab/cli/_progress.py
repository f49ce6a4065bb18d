"""Live progress for long commands: one bar (or spinner) on stderr, only for a person watching.

Shown only when stderr is a terminal, so it never reaches a pipe, a log file, `--json` readers
(stdout carries the JSON; this writes to stderr) or a test's captured output. Transient: the bar
is gone when the command ends, leaving only its result. SCALELAB_NO_PROGRESS=1 turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from scalelab.cli._output import err_console


def shown() -> bool:
    """Whether progress is drawn: stderr is a terminal and SCALELAB_NO_PROGRESS is unset."""
    return err_console.is_terminal and not os.environ.get("SCALELAB_NO_PROGRESS")


class Tracker:
    """What a command tells its bar: how far it is, out of how much, doing what."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task

    def update(self, *, completed: float | None = None, total: float | None = None,
               note: str | None = None) -> None:
        """Set the position, the total (None keeps it) and the line describing the work."""
        self._progress.update(self._task, completed=completed, total=total, description=note)

    def advance(self, note: str | None = None, by: float = 1.0) -> None:
        """One more unit done; `note` says what comes next or what just finished."""
        self._progress.update(self._task, advance=by, description=note)


@contextmanager
def live_progress(description: str, total: float | None = None) -> Iterator[Tracker]:
    """A bar (with a total) or a spinner (without) for the duration of the block."""
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err_console, transient=True,
                  disable=not shown()) as progress:
        yield Tracker(progress, progress.add_task(description, total=total))
