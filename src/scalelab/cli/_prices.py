"""`--prices FILE`: the one price table for every command that prints a cost.

A command decorated with `prices_option` gets the table (core/prices.py) from `--prices`, else
$SCALELAB_PRICES, else the defaults `scalelab diagnose` uses; its own per-entry flags (e.g.
`--core-hour-usd`) default to None and, when given, override that entry for the run.
"""

from __future__ import annotations

from pathlib import Path

import click

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.prices import ENV, Prices, price_table

prices_option = click.option(
    "--prices", "prices_file", type=click.Path(path_type=Path, dir_okay=False),
    help=f"The price table: a scalelab.yaml (its prices: section) or a YAML of core_hour_usd, "
         f"gpu_hour_usd, ... (default: ${ENV}, else the built-in table that scalelab "
         "diagnose --print-config shows).")
"""Decorator: the command takes `prices_file: Path | None`."""
core_hour_option = click.option(
    "--price-per-core-hour", type=float,
    help="Overrides the price table's core_hour_usd for this run (--prices).")
"""Decorator: the command takes `price_per_core_hour: float | None` (pass it to resolve_prices
as core_hour_usd)."""


def resolve_prices(prices_file: Path | None, **overrides: float | None) -> Prices:
    """The configured table with this run's per-entry overrides (None: not given)."""
    table, _ = price_table(prices_file)
    given = {k: v for k, v in overrides.items() if v is not None}
    bad = [k for k, v in given.items() if v < 0]
    if bad:
        raise BadUsageError(f"prices must be >= 0: {', '.join(bad)}")
    return table.model_copy(update=given)
