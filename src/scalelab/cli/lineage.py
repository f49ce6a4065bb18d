"""`scalelab lineage show | impacted`: the recorded graph, and what to rebuild after a change.

The store is $SCALELAB_LINEAGE or ./.scalelab/lineage.db unless --lineage names one.
`impacted` exits 0 whether or not SOURCE changed (the JSON's "changed" says which); 2 when SOURCE
was never recorded.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from scalelab.cli._output import emit, json_option
from scalelab.layers.lineage.store import LineageStore

lineage_option = click.option(
    "--lineage", type=click.Path(path_type=Path), default=None,
    help="Lineage store (default $SCALELAB_LINEAGE or ./.scalelab/lineage.db).")


@click.group(no_args_is_help=True)
def app() -> None:
    """Which sources, datasets and models came from which."""


@app.command("show")
@lineage_option
@json_option
def show_cmd(lineage: Path | None, as_json: bool) -> None:
    """Print every recorded node and its inputs."""
    store = LineageStore(lineage)
    g = store.graph()

    def render(c: Console) -> None:
        nodes = {n["id"]: n for n in g["nodes"]}
        inputs: dict[int, list[int]] = {}
        for e in g["edges"]:
            inputs.setdefault(e["dst"], []).append(e["src"])
        c.print(f"lineage store {g['store']}: {len(g['nodes'])} nodes, {len(g['edges'])} edges")
        for n in g["nodes"]:
            if n["kind"] == "source" and n["id"] not in inputs:
                continue
            c.print(f"[bold]{n['kind']}[/] {n['path']}  [dim]{n['digest'][:12]} "
                    f"{n['created_at'][:19]}[/]")
            for src in inputs.get(n["id"], []):
                s = nodes[src]
                c.print(f"  <- {s['kind']} {s['path']}  [dim]{s['digest'][:12]}[/]")

    emit(g, as_json, render)


@app.command("impacted")
@click.argument("source", type=click.Path(path_type=Path))
@lineage_option
@json_option
def impacted_cmd(source: Path, lineage: Path | None, as_json: bool) -> None:
    """List every dataset and model to rebuild because SOURCE changed (and its changed parts)."""
    imp = LineageStore(lineage).impacted(source)

    def render(c: Console) -> None:
        if not imp.changed:
            c.print(f"{imp.source} is unchanged (digest {imp.recorded_digest[:12]}); "
                    "nothing to rebuild")
            return
        now = imp.current_digest[:12] if imp.current_digest else "deleted"
        c.print(f"{imp.source} changed: {imp.recorded_digest[:12]} -> {now}")
        for name, parts in imp.changed_parts.items():
            unit = imp.part_unit.get(name, "part")
            what = "row groups" if unit == "row_group" else (
                "65,536-line blocks" if unit == "lines" else "8 MiB blocks")
            c.print(f"  changed {what} {', '.join(map(str, parts))}" + (f" of {name}" if name
                                                                        else ""))
        c.print(f"rebuild ({len(imp.downstream)}):")
        for n in imp.downstream:
            c.print(f"  {n['kind']} {n['path']}  [dim]{n['digest'][:12]}[/]")

    emit(imp, as_json, render)
