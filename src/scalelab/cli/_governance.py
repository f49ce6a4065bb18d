"""The one `--governance FILE` option of `scalelab serve`, `generate serve`, `retrieval serve`.

The file is read and validated here, before any server starts, so a bad field is one line and
exit 2 (the server processes read it again: uvicorn workers are new processes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def _check(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    if value is None:
        return None
    from scalelab.layers.web.governance.config import load_governance

    load_governance(value)  # BadInputError naming the file and field -> exit 2
    return value.resolve()


governance_option = click.option(
    "--governance", "governance", default=None, callback=_check,
    type=click.Path(path_type=Path, dir_okay=False),
    help="YAML/JSON governance file: per-client rate limits, concurrency caps, budgets; "
         "enables the kill-switch admin routes (docs/governance.md). None = no governance "
         "layer at all.")
"""Decorator: the command gets `governance: Path | None` (resolved, validated)."""


def governance_file(value: Any) -> str | None:
    """The settings' string form of the option's value."""
    return str(value) if value is not None else None
