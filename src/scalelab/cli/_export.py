"""--output FILE.csv|FILE.json on the commands that print a table: the table's rows as CSV, or
the whole --json document, written to a file beside what the command prints.

Every command that prints a --json document has it: `give_output` adds the option (the
command's function never sees it) to each one the CLI loads that does not declare it with
`@output_option`, and `_output.emit` writes the file, so the commands themselves make no call.
The CSV's rows are the document's table: its "rows", "levels", "steps", "sheet" or "models",
else its first other list of objects, else the document itself as one row."""

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


_HELP = ("Also write the table to FILE.csv (one line per row) or the --json document to "
         "FILE.json.")
_META = "scalelab.output"
"""Where the added option keeps its path (ctx.meta, shared by the command's contexts)."""

output_option = click.option(
    "--output", "output", type=click.Path(dir_okay=False, path_type=Path), callback=_check,
    help=_HELP)
"""Decorator: --output FILE.csv|FILE.json, the suffix checked before any work runs."""


def _keep(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    ctx.meta[_META] = _check(ctx, param, value)


def give_output(cmd: click.Command) -> click.Command:
    """`cmd` and, for a group, every command under it: each that has --json and no --output
    gets one (not passed to its function; `export_current` reads it). Idempotent."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            give_output(sub)
        return cmd
    names = {p.name for p in cmd.params}
    if "as_json" in names and "output" not in names:
        cmd.params.append(click.Option(
            ["--output", "output"], type=click.Path(dir_okay=False, path_type=Path),
            callback=_keep, expose_value=False, help=_HELP))
    return cmd


def _cell(v: Any) -> Any:
    v = jsonable(v)
    return json.dumps(v, separators=(",", ":")) if isinstance(v, dict | list) else v


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    """Nested objects one level down as their own columns ("latency.p50_ms"): a spreadsheet
    reads numbers, not JSON."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, Mapping) and v and all(not isinstance(x, Mapping | list)
                                                 for x in v.values()):
            out.update({f"{k}.{sub}": x for sub, x in v.items()})
        else:
            out[k] = v
    return out


def write_output(path: Path | None, doc: Mapping[str, Any],
                 rows: Callable[[], Sequence[Mapping[str, Any]]]) -> None:
    """Write `doc` (a .json file) or `rows()` (a .csv file: the union of their keys, in first
    seen order; flat objects as columns, deeper values as compact JSON) to `path`; nothing
    when path is None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(jsonable(with_schema(doc)), indent=2, allow_nan=False) + "\n",
                        encoding="utf-8")
        return
    table = [_flat(r) for r in rows()]
    fields = list(dict.fromkeys(k for r in table for k in r))
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows({k: _cell(r.get(k)) for k in fields} for r in table)


TABLE_KEYS = ("rows", "levels", "steps", "sheet", "models")
"""Where a command's document keeps its table, in the order looked for."""


def _is_table(rows: Any) -> bool:
    return isinstance(rows, list) and bool(rows) and all(isinstance(r, Mapping) for r in rows)


def table_rows(doc: Any) -> list[Mapping[str, Any]]:
    """The rows of `doc`'s table: TABLE_KEYS first, then its first other list of objects, then
    `doc` itself as one row; [] for a document that is not an object."""
    if not isinstance(doc, Mapping):
        return []
    for key in (*TABLE_KEYS, *(k for k in doc if k not in TABLE_KEYS)):
        if _is_table(doc.get(key)):
            return list(jsonable(doc[key]))
    return [jsonable(doc)]


def _plot_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    from scalelab.lab.report.figures import check_path

    return None if value is None else check_path(value)


def levels_plot_option(metric: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--plot FILE on `load run` and `load llm run`: each level's `metric` distribution and
    its quantiles against the load (lab/report/levels_figure.py), drawn by `export_current`."""
    return click.option(
        "--plot", f"levels_plot_{metric}", type=click.Path(dir_okay=False, path_type=Path),
        callback=_plot_path,
        help=f"Also draw each level's {metric} distribution and {metric} against the load to "
             "FILE (.png or .svg).")


def export_current(doc: Any) -> None:
    """Write `doc` to the running command's --output and draw its --plot (levels_plot_option),
    when it has those options and they are set."""
    doc = jsonable(doc)  # a dataclass (plan's tables) as the object --json prints
    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx is not None else {}
    for key, plot in params.items():
        if key.startswith("levels_plot_") and isinstance(plot, Path) and isinstance(doc, Mapping):
            from scalelab.lab.report.figures import save
            from scalelab.lab.report.levels_figure import levels_figure

            metric = key.removeprefix("levels_plot_")
            save(levels_figure(jsonable(doc.get("levels")) or [], metric=metric,
                               title=f"{metric} against the load"), plot)
    path = params.get("output") or (ctx.meta.get(_META) if ctx is not None else None)
    if isinstance(path, Path):
        if path.suffix.lower() == ".csv" and not table_rows(doc):
            raise BadUsageError(f"--output {path}: this output has no table; use a .json file")
        write_output(path, doc, lambda: table_rows(doc))
