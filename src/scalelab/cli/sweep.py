"""`scalelab sweep`: scale the user's own command one variable at a time."""

from __future__ import annotations

import click


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def sweep(cmd: tuple[str, ...]) -> None:
    """Run a command at each level of one variable and fit the curve."""
