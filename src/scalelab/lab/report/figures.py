"""One figure per idea (matplotlib, Agg), drawn the same for a command's --plot and the report.

Each function takes plain numbers and returns a Figure: `save` writes it as PNG or SVG for a
command's `--plot FILE`; report/plots.py embeds the same figures as inline SVG. What a figure
plots is exactly what it was given (tests read the lines back from the Figure).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.fits import fit_scaling
from scalelab.lab.core.usl import usl
from scalelab.layers.plan.chinchilla import ChinchillaParams, compute_optimal

plt.rcParams.update({"svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9})

FORMATS = (".png", ".svg")
"""File suffixes --plot accepts (the format follows the suffix)."""


def check_path(path: Path) -> Path:
    """The --plot file, refused before any work when its suffix names no format we write."""
    if path.suffix.lower() not in FORMATS:
        raise BadUsageError(f"--plot {path}: use a file name ending in .png or .svg")
    if path.exists() and path.is_dir():
        raise BadUsageError(f"--plot {path}: is a directory; give a file name")
    return path


def save(fig: Figure, path: Path) -> Path:
    """Write `fig` to `path` (PNG or SVG by the suffix) and release it."""
    check_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format=path.suffix.lower()[1:], bbox_inches="tight", dpi=120)
    finally:
        plt.close(fig)
    return path


class _PlainLog(LogFormatter):
    """Log-axis tick labels as plain numbers (0.1, 10, 2000), on the ticks matplotlib's own
    formatter labels: SVG text in the figure's font-family list, where the default's
    mathtext (10 with a raised 2) is a run of glyphs in DejaVu Sans alone, parsed per label
    (~8% of the report's figure time)."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:g}"


def _log_scale(ax: Axes, axis: str) -> None:
    """A log-scaled axis ("x" or "y") with plain-number labels (_PlainLog)."""
    which = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    which.set_major_formatter(_PlainLog())
    which.set_minor_formatter(_PlainLog(labelOnlyBase=False))


@dataclass(kw_only=True)
class Curve:
    """One measured series: points at levels of the variable, with an optional range."""

    name: str
    """Legend label."""
    x: list[float]
    """Levels of the variable."""
    y: list[float]
    """The measured value at each level (a median when repeated)."""
    low: list[float] | None = None
    """Lowest value at each level (None: no error bars)."""
    high: list[float] | None = None
    """Highest value at each level."""
    fit: bool = True
    """Draw the best scaling-law fit (USL, Amdahl or linear by AIC) with 3+ distinct levels."""


@dataclass(kw_only=True)
class Bound:
    """A horizontal objective line."""

    value: float
    label: str


def _finish(fig: Figure, ax: Axes, *, title: str, xlabel: str | None = None,
            ylabel: str | None = None, both_grids: bool = False) -> Figure:
    """The house style every figure ends with: labels, title, a light grid, a small legend."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both" if both_grids else "major")
    ax.legend(fontsize=7)
    return fig


def scaling_figure(curves: Sequence[Curve], *, variable: str, ylabel: str, title: str,
                   bounds: Sequence[Bound] = ()) -> Figure:
    """Throughput against the scaled variable; dashed: the law chosen by AIC, fitted."""
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    for c in curves:
        if c.low is not None and c.high is not None:
            err = [[y - lo for y, lo in zip(c.y, c.low, strict=True)],
                   [hi - y for y, hi in zip(c.y, c.high, strict=True)]]
            color = ax.errorbar(c.x, c.y, yerr=err, marker="o", capsize=3,
                                label=c.name)[0].get_color()
        else:
            color = ax.plot(c.x, c.y, marker="o", linestyle="none", label=c.name)[0].get_color()
        if c.fit and len(set(c.x)) >= 3:
            try:
                fit = fit_scaling(c.x, c.y)
            except Exception:  # a degenerate curve still gets its points drawn
                fit = None
            m = fit.model(fit.chosen) if fit is not None else None
            if fit is not None and m is not None:
                grid = np.linspace(min(c.x), max(c.x), 61)
                p = m.params
                yy = usl(grid, p["gamma"], p.get("alpha", 0.0), p.get("beta", 0.0))
                ax.plot(grid, yy, linestyle="--", color=color, alpha=0.6,
                        label=f"{c.name}: {fit.chosen} fit")
    for b in bounds:
        ax.axhline(b.value, color="crimson", linestyle=":", label=f"objective {b.label}")
    return _finish(fig, ax, xlabel=variable, ylabel=ylabel, title=title)


@dataclass(kw_only=True)
class LatencyCurve:
    """Latency quantiles of one series against the load variable."""

    name: str
    x: list[float]
    quantiles: dict[str, list[float | None]] = field(default_factory=dict)
    """'p50' / 'p95' / 'p99' -> ms at each x (None where not measured)."""
    passed: list[bool] | None = None
    """Per x, whether the level met its objectives (marks: green/red; None: no marks)."""


_STYLES = {"p50": ":", "p95": "-", "p99": "--"}


def latency_figure(curves: Sequence[LatencyCurve], *, variable: str, title: str,
                   bounds: Sequence[Bound] = (), marker_x: float | None = None,
                   marker_label: str = "") -> Figure:
    """Latency quantiles (log scale) against load; objective lines; an optional vertical mark."""
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    for c in curves:
        for q, ys in c.quantiles.items():
            if any(v is not None for v in ys):
                ax.plot(c.x, [math.nan if v is None else v for v in ys], marker="o",
                        linestyle=_STYLES.get(q, "-"), label=f"{c.name} {q}")
        if c.passed is not None and "p95" in c.quantiles:
            for x, y, ok in zip(c.x, c.quantiles["p95"], c.passed, strict=True):
                if y is not None:
                    ax.scatter([x], [y], color="tab:green" if ok else "tab:red", zorder=3, s=18)
    for b in bounds:
        ax.axhline(b.value, color="crimson", linestyle=":", label=f"objective {b.label}")
    if marker_x is not None:
        ax.axvline(marker_x, color="tab:blue", linestyle="--", label=marker_label)
    _log_scale(ax, "y")
    return _finish(fig, ax, xlabel=variable, ylabel="latency (ms)", title=title,
                   both_grids=True)


def chinchilla_figure(n: Sequence[float], d: Sequence[float], loss: Sequence[float],
                      params: ChinchillaParams, *, title: str) -> Figure:
    """Each run's loss against its compute C = 6ND; the line: the fitted law's compute-optimal
    loss at every C of the runs' range (the best any split of that compute reaches)."""
    nn, dd = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
    compute = 6.0 * nn * dd
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    ax.scatter(compute, loss, s=12, alpha=0.7, label="runs")
    if params.alpha > 0 and params.beta > 0:
        grid = np.geomspace(compute.min(), compute.max(), 60)
        best = [compute_optimal(params, float(c)).loss for c in grid]
        ax.plot(grid, best, color="crimson", label="fitted law, compute-optimal")
    _log_scale(ax, "x")
    return _finish(fig, ax, xlabel="training compute C = 6ND (FLOP)", ylabel="loss", title=title,
                   both_grids=True)


def frontier_figure(series: Mapping[str, Sequence[tuple[float, float]]], *, title: str,
                    target: float | None = None) -> Figure:
    """Recall against queries/s, one line per index over its parameter grid (ann-benchmarks'
    plot: up and to the right is better)."""
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for name, pts in series.items():
        ordered = sorted(pts)
        ax.plot([p[0] for p in ordered], [p[1] for p in ordered], marker="o", label=name)
    if target is not None:
        ax.axvline(target, color="crimson", linestyle=":", label=f"recall target {target:g}")
    _log_scale(ax, "y")
    return _finish(fig, ax, xlabel="recall@10", ylabel="queries/s (one at a time)", title=title,
                   both_grids=True)


def timeline_figure(series: Mapping[str, Sequence[tuple[float, float]]], *, xlabel: str,
                    ylabel: str, title: str) -> Figure:
    """A quality over time, one line per policy."""
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    for name, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    return _finish(fig, ax, xlabel=xlabel, ylabel=ylabel, title=title)
