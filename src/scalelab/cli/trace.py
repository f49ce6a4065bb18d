"""`scalelab trace show FILE.jsonl...`: the slowest traces as waterfalls, and where p99 goes.

    scalelab trace show spans.jsonl [more.jsonl] [--top 5] [--quantile 0.99] [--json]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from scalelab.cli._output import emit, json_option
from scalelab.lab.core.errors import BadUsageError

BAR_WIDTH = 40


@click.group()
def app() -> None:
    """Read request traces written by the servers' --trace-out."""


@app.command("show")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--top", default=5, show_default=True, type=int,
              help="How many of the slowest traces to draw.")
@click.option("--quantile", default=0.99, show_default=True, type=float,
              help="Attribute the traces at or above this quantile of end-to-end time.")
@json_option
def show_cmd(files: tuple[Path, ...], top: int, quantile: float, as_json: bool) -> None:
    """Assemble traces from span files (one server's or several), draw the slowest and
    attribute the tail's time to span names (self time, children subtracted)."""
    from scalelab.layers.observe.traces import read_spans, summary

    if top < 0:
        raise BadUsageError(f"--top {top} must be >= 0")
    if not 0 < quantile <= 1:
        raise BadUsageError(f"--quantile {quantile} must lie in (0, 1]")
    spans = read_spans(files)
    doc = summary(spans, top=top, q=quantile, width=BAR_WIDTH)
    doc["files"] = [str(f) for f in files]
    emit(doc, as_json, lambda c: _render(c, doc))


def _render(c: Console, doc: dict[str, Any]) -> None:
    c.print(f"{doc['spans']} spans, {doc['traces']} traces from {', '.join(doc['files'])}")
    att = doc["attribution"]
    if att is None:
        c.print("no traces: was the server started with --trace-sample > 0 (or sent a "
                "sampled traceparent)?")
        return
    c.print(Text(att["line"], style="bold"))
    for tr in doc["slowest"]:
        t = Table(title=f"trace {tr['trace_id']}: {tr['duration_ms']:.3f} ms",
                  title_justify="left", show_edge=False, pad_edge=False)
        t.add_column("span", no_wrap=True, min_width=24)
        t.add_column("start ms", justify="right")
        t.add_column("ms", justify="right")
        t.add_column("", no_wrap=True)
        for r in tr["spans"]:
            bar = Text(" " * r["bar_start"])
            bar.append("█" * r["bar_len"], style="cyan" if r["depth"] else "magenta")
            bar.append(" " * (BAR_WIDTH - r["bar_start"] - r["bar_len"]))
            svc = f" [dim]({escape(r['service'])})[/]" if r["depth"] == 0 and r["service"] \
                else ""
            t.add_row(f"{'  ' * r['depth']}{escape(r['name'])}{svc}", f"{r['offset_ms']:.3f}",
                      f"{r['duration_ms']:.3f}", bar)
        c.print(t)
