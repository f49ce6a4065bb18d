"""Shared CLI plumbing: JSON or rich output, list parsing, a default-subcommand group.

Rules every command follows: `--json` prints exactly one JSON document on stdout and nothing
else (progress and warnings go to stderr); without it, rich tables for people.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.serialize import jsonable, with_schema

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout, nothing else."
)
"""Decorator: every command that computes takes --json."""


def _plot_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    if value is None:
        return None
    from scalelab.lab.report.figures import check_path

    return check_path(value)


def plot_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--plot FILE: also draw `what` to FILE (.png or .svg), checked before any work runs."""
    return click.option(
        "--plot",
        "plot",
        type=click.Path(dir_okay=False, path_type=Path),
        callback=_plot_path,
        help=f"Also draw {what} to FILE (.png or .svg: the suffix picks the format).",
    )


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def stacked(options: Sequence[Decorator]) -> Decorator:
    """Several click options as one decorator; --help lists them in the order given."""

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        # click lists a command's options innermost first, so the first option goes on last.
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(with_schema(data)), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def emit(data: Any, as_json: bool, render: Callable[[Console], None]) -> None:
    """One JSON document when `as_json`, else let `render` draw for people; and the command's
    --output FILE.csv|FILE.json when it has one (_export.py)."""
    from scalelab.cli._export import export_current

    if as_json:
        print_json(data)
    else:
        render(console)
    export_current(data)


def parse_list(text: str, *, what: str, kind: type = float) -> list[Any]:
    """'1,2,5,10' -> [1, 2, 5, 10]; a clear error naming the flag otherwise."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise BadUsageError(f"{what}: empty list; give comma-separated values like 1,2,5,10")
    out: list[Any] = []
    for t in items:
        try:
            v = kind(t)
        except ValueError:
            raise BadUsageError(
                f"{what}: {t!r} is not a{'n integer' if kind is int else ' number'}; "
                "give comma-separated values like 1,2,5,10"
            ) from None
        if isinstance(v, float) and not math.isfinite(v):
            raise BadUsageError(f"{what}: {t!r} is not a finite number")
        out.append(v)
    return out


class DefaultGroup(click.Group):
    """A group that runs `default_command` when the first argument names no subcommand.

    Lets `scalelab load URL` and `scalelab load capacity URL` coexist:
    `@click.group(cls=DefaultGroup)` and a subcommand named "run".
    """

    default_command = "run"

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in self.commands:
            return super().resolve_command(ctx, args)
        cmd = self.commands.get(self.default_command)
        if cmd is None:
            return super().resolve_command(ctx, args)
        return self.default_command, cmd, args

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Without this, click treats the leading option of the default command as the group's.
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)
