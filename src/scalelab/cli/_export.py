"""--output FILE.csv|FILE.json on the commands that print a table: the table's rows as CSV, or
the whole --json document, written to a file beside what the command prints."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.serialize import jsonable, with_schema

SUFFIXES = (".csv", ".json")


def _check(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    if value is not None and value.suffix.lower() not in SUFFIXES:
        raise BadUsageError(f"--output {value}: use a file name ending in .csv or .json")
    return value


output_option = click.option(
    "--output", "output", type=click.Path(dir_okay=False, path_type=Path), callback=_check,
    help="Also write the table to FILE.csv (one line per row) or the --json document to "
         "FILE.json.")
"""Decorator: --output FILE.csv|FILE.json, the suffix checked before any work runs."""


def _cell(v: Any) -> Any:
    v = jsonable(v)
    return json.dumps(v, separators=(",", ":")) if isinstance(v, dict | list) else v


def write_output(path: Path | None, doc: Mapping[str, Any],
                 rows: Callable[[], Sequence[Mapping[str, Any]]]) -> None:
    """Write `doc` (a .json file) or `rows()` (a .csv file: the union of their keys, in first
    seen order; nested values as compact JSON) to `path`; nothing when path is None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(jsonable(with_schema(doc)), indent=2, allow_nan=False) + "\n",
                        encoding="utf-8")
        return
    table = list(rows())
    fields = list(dict.fromkeys(k for r in table for k in r))
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows({k: _cell(r.get(k)) for k in fields} for r in table)
