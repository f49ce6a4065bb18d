"""Curves as inline SVG (matplotlib, Agg): throughput, latency and cost against the variable.

SVG text is embedded in the HTML, so the report needs no external files, scripts or fonts.
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scalelab.core.fits import fit_scaling
from scalelab.core.objectives import Objective
from scalelab.core.sheet import SheetRow
from scalelab.core.usl import usl

plt.rcParams.update({"svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9})


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _by_series(rows: list[SheetRow]) -> dict[str, list[SheetRow]]:
    out: dict[str, list[SheetRow]] = {}
    for r in sorted(rows, key=lambda r: r.level):
        out.setdefault(r.series or "measured", []).append(r)
    return out


def throughput_plot(stage: str, rows: list[SheetRow], objectives: list[Objective]) -> str | None:
    series = {s: [r for r in rs if r.rate is not None] for s, rs in _by_series(rows).items()}
    series = {s: rs for s, rs in series.items() if rs}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    for name, rs in series.items():
        x = [r.level for r in rs]
        y = [r.rate or 0.0 for r in rs]
        lo = [(r.rate or 0) - (r.rate_min or r.rate or 0) for r in rs]
        hi = [(r.rate_max or r.rate or 0) - (r.rate or 0) for r in rs]
        line = ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=name)
        if len(set(x)) >= 3:
            try:
                fit = fit_scaling(x, y)
            except Exception:  # a degenerate curve still gets its points drawn
                fit = None
            if fit is not None and fit.usl is not None:
                grid = [min(x) + (max(x) - min(x)) * i / 60 for i in range(61)]
                m = fit.model(fit.chosen)
                if m is not None:
                    import numpy as np

                    p = m.params
                    yy = usl(np.asarray(grid), p["gamma"], p.get("alpha", 0.0), p.get("beta", 0.0))
                    ax.plot(
                        grid,
                        yy,
                        linestyle="--",
                        color=line[0].get_color(),
                        alpha=0.6,
                        label=f"{name}: {fit.chosen} fit",
                    )
    for o in objectives:
        if o.metric == "rate":
            bound = o.min if o.min is not None else o.max
            assert bound is not None
            ax.axhline(bound, color="crimson", linestyle=":", label=f"objective {o.label}")
    unit = next((r.rate_unit for rs in series.values() for r in rs if r.rate_unit), "")
    var = next(iter(series.values()))[0].variable
    ax.set_xlabel(var)
    ax.set_ylabel(f"throughput ({unit})" if unit else "throughput")
    ax.set_title(f"{stage}: throughput vs {var}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _svg(fig)


def latency_plot(stage: str, rows: list[SheetRow], objectives: list[Objective]) -> str | None:
    series = {s: [r for r in rs if r.p95_ms is not None] for s, rs in _by_series(rows).items()}
    series = {s: rs for s, rs in series.items() if rs}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    for name, rs in series.items():
        x = [r.level for r in rs]
        for q, style in (("p50_ms", ":"), ("p95_ms", "-"), ("p99_ms", "--")):
            y = [getattr(r, q) for r in rs]
            if any(v is not None for v in y):
                ax.plot(
                    x,
                    [math.nan if v is None else v for v in y],
                    marker="o",
                    linestyle=style,
                    label=f"{name} {q[:3]}",
                )
    for o in objectives:
        if o.metric in ("p50_ms", "p95_ms", "p99_ms") and o.max is not None:
            ax.axhline(o.max, color="crimson", linestyle=":", label=f"objective {o.label}")
    var = next(iter(series.values()))[0].variable
    ax.set_xlabel(var)
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{stage}: latency vs {var}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _svg(fig)


def cost_plot(stage: str, rows: list[SheetRow]) -> str | None:
    series = {
        s: [r for r in rs if r.cost_per_unit_usd is not None] for s, rs in _by_series(rows).items()
    }
    series = {s: rs for s, rs in series.items() if rs}
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
