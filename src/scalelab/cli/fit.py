"""`scalelab fit ...`: fit scaling curves to measured data."""

from __future__ import annotations

import click


@click.group(no_args_is_help=True)
def app() -> None:
    """Fit scaling laws to measurements (USL, Amdahl, Chinchilla)."""
