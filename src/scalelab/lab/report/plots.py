"""Curves as inline SVG (matplotlib, Agg): throughput, latency and cost against the variable.

Throughput and latency are figures.py's figures, the ones the commands' --plot writes.

SVG text is embedded in the HTML, so the report needs no external files, scripts or fonts.
"""

from __future__ import annotations

import io
import math

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.report.figures import (
    Bound,
    Curve,
    LatencyCurve,
    frontier_figure,
    latency_figure,
    scaling_figure,
    timeline_figure,
)


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _by_series(rows: list[SheetRow], field: str) -> dict[str, list[SheetRow]]:
    """The rows that measured `field`, by series in level order (series without any left out)."""
    out: dict[str, list[SheetRow]] = {}
    for r in sorted(rows, key=lambda r: r.level):
        # every series gets its place first: the order (and colours) follow all the rows
        kept = out.setdefault(r.series or "measured", [])
        if getattr(r, field) is not None:
            kept.append(r)
    return {s: rs for s, rs in out.items() if rs}


def throughput_plot(stage: str, rows: list[SheetRow], objectives: list[Objective]) -> str | None:
    series = _by_series(rows, "rate")
    if not series:
        return None
    curves = [
        Curve(
            name=name,
            x=[r.level for r in rs],
            y=[r.rate or 0.0 for r in rs],
            low=[r.rate_min or r.rate or 0.0 for r in rs],
            high=[r.rate_max or r.rate or 0.0 for r in rs],
        )
        for name, rs in series.items()
    ]
    bounds = []
    for o in objectives:
        if o.metric == "rate":
            bound = o.min if o.min is not None else o.max
            assert bound is not None
            bounds.append(Bound(value=bound, label=o.label))
    unit = next((r.rate_unit for rs in series.values() for r in rs if r.rate_unit), "")
    var = next(iter(series.values()))[0].variable
    return _svg(
        scaling_figure(
            curves,
            variable=var,
            ylabel=f"throughput ({unit})" if unit else "throughput",
            title=f"{stage}: throughput vs {var}",
            bounds=bounds,
        )
    )


def latency_plot(stage: str, rows: list[SheetRow], objectives: list[Objective]) -> str | None:
    series = _by_series(rows, "p95_ms")
    if not series:
        return None
    curves = [
        LatencyCurve(
            name=name,
            x=[r.level for r in rs],
            quantiles={q: [getattr(r, f"{q}_ms") for r in rs] for q in ("p50", "p95", "p99")},
        )
        for name, rs in series.items()
    ]
    bounds = [
        Bound(value=o.max, label=o.label)
        for o in objectives
        if o.metric in ("p50_ms", "p95_ms", "p99_ms") and o.max is not None
    ]
    var = next(iter(series.values()))[0].variable
    return _svg(
        latency_figure(curves, variable=var, title=f"{stage}: latency vs {var}", bounds=bounds)
    )


def cost_plot(stage: str, rows: list[SheetRow]) -> str | None:
    series = _by_series(rows, "cost_per_unit_usd")
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 2.6))
    for name, rs in series.items():
        ax.plot(
            [r.level for r in rs], [r.cost_per_unit_usd or 0.0 for r in rs], marker="o", label=name
        )
    unit = next((r.cost_unit for rs in series.values() for r in rs if r.cost_unit), "unit")
    var = next(iter(series.values()))[0].variable
    ax.set_xlabel(var)
    ax.set_ylabel(f"USD per {unit}")
    ax.set_title(f"{stage}: cost per {unit}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _svg(fig)


def pareto_plot(stage: str, rows: list[SheetRow], quality_key: str | None) -> str | None:
    """Variants (one series each): quality against p95 latency; the frontier is drawn."""
    pts = []
    for r in rows:
        q = r.quality.get(quality_key) if quality_key else None
        if r.p95_ms is not None and q is not None:
            pts.append((r.p95_ms, q, r.series or f"{r.level:g}"))
    if len(pts) < 2:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for x, y, name in pts:
        ax.scatter([x], [y])
        ax.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    frontier, best = [], -math.inf
    for x, y, _ in sorted(pts):
        if y > best:
            frontier.append((x, y))
            best = y
    ax.plot(
        [p[0] for p in frontier],
        [p[1] for p in frontier],
        linestyle="--",
        alpha=0.5,
        label="Pareto frontier",
    )
    ax.set_xlabel("p95 latency at batch 1 (ms)")
    ax.set_ylabel(quality_key or "quality")
    ax.set_title(f"{stage}: quality vs latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _svg(fig)


def frontier_plot(stage: str, records: list[Record]) -> str | None:
    """The retrieval bench's recall-QPS frontier (each record's grid, as `retrieval bench
    --plot` draws it from the command's JSON)."""
    series = {
        f"{r.extras['index']} x{r.level:g}": [(p["recall"], p["qps"]) for p in r.extras["grid"]]
        for r in records
        if r.stage == stage and r.ok and isinstance(r.extras.get("grid"), list)
    }
    if not series:
        return None
    return _svg(frontier_figure(series, title=f"{stage}: recall vs QPS"))


def monthly_plot(stage: str, records: list[Record]) -> str | None:
    """Macro F1 per month, one line per policy (as `online replay/bench --plot` draws it)."""
    series = {
        str(r.extras.get("policy", r.level)): [
            (float(m["month"]), float(m["macro_f1"])) for m in r.extras["monthly"]
        ]
        for r in records
        if r.stage == stage and r.ok and isinstance(r.extras.get("monthly"), list)
    }
    if not series:
        return None
    return _svg(
        timeline_figure(
            series,
            xlabel="month of 2013 (prediction time)",
            ylabel="prequential macro F1",
            title=f"{stage}: quality over time per update policy",
        )
    )
