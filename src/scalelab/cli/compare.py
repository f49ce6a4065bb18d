"""`scalelab compare A B`: B against A per stage, level and metric, decided at a confidence.

    scalelab compare before.jsonl after.jsonl [--margin 5%] [--fail-on worse] [--json]
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._export import output_option
from scalelab.cli._gate import exit_if_missed
from scalelab.cli._output import emit, json_option, plot_option
from scalelab.lab.compare.calibration import noise_of
from scalelab.lab.compare.comparison import Comparison, compare
from scalelab.lab.compare.sides import read_side
from scalelab.lab.compare.table import HEADER, cells, markdown, summary, to_html
from scalelab.lab.core.objectives import parse_percent

_STYLE = {"worse": "red", "better": "green", "equivalent": "", "undecided": "yellow"}


@click.command("compare")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--margin", default="5%", show_default=True,
              help="B/A within 1 ± margin is equivalent: the smallest difference that matters.")
@click.option("--confidence", default="95%", show_default=True,
              help="Family-wise confidence over all the metrics compared (Holm).")
@click.option("--noise", type=click.Path(path_type=Path),
              help="Records of 2+ repeated runs of one unchanged setup (A's duration and "
                   "rate, same machine): their spread between runs is counted in every "
                   "interval, so one run a side can be decided.")
@click.option("--fail-on", type=click.Choice(["worse", "undecided"]),
              help="Exit 1 when a metric is worse (or, with undecided, worse or undecided): "
                   "a CI regression gate.")
@click.option("--markdown", "md", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the table as Markdown to FILE.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the table as HTML to FILE.")
@output_option
@plot_option("B/A with its interval, one row per metric")
@json_option
def compare_cmd(a: Path, b: Path, margin: str, confidence: str, noise: Path | None,
                fail_on: str | None,
                md: Path | None, html_path: Path | None, output: Path | None,
                plot: Path | None, as_json: bool) -> None:
    """Compare run B against run A: records files, or run/report directories holding
    records.jsonl. Per stage, level and metric: B/A with its interval and a decision (better,
    worse, equivalent within the margin, or undecided with what would decide it).

    \b
    Exit status: 0 done; 1 --fail-on matched; 2 bad usage or input; 70 internal error.
    """
    spread = None if noise is None else noise_of(noise)
    c = compare(read_side(a), read_side(b), margin=parse_percent(margin, what="--margin"),
                confidence=parse_percent(confidence, what="--confidence"), noise=spread)
    doc = {"a": str(a), "b": str(b), **c.to_json()}
    if md is not None:
        md.write_text(markdown(c), encoding="utf-8")
    if html_path is not None:
        html_path.write_text(to_html(c), encoding="utf-8")
    if plot is not None:
        from scalelab.lab.compare.table import figure

        figure(c, plot)
    emit(doc, as_json, lambda con: _render(con, c))
    bad = {"worse": ("worse",), "undecided": ("worse", "undecided")}.get(fail_on or "", ())
    exit_if_missed([f"{r.metric} at {r.stage} {r.variable}={r.level:g} is {r.decision}"
                    for r in c.rows if r.decision in bad])


def _render(con: Console, c: Comparison) -> None:
    t = Table(title=summary(c), title_justify="left")
    for h in HEADER:
        t.add_column(h, overflow="fold")
    for r in c.rows:
        t.add_row(*cells(r), style=_STYLE[r.decision])
    con.print(t)
    for note in c.notes:
        con.print(f"note: {note}")
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        if keys:
            con.print(f"only in {side}: " + ", ".join(f"{s} {v}={lv:g}" for s, _, v, lv in keys))
