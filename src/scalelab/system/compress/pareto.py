"""The Pareto front of quality vs latency, and its plot (matplotlib, Agg; PNG or SVG)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scalelab.lab.core.errors import BadUsageError


@dataclass(frozen=True, kw_only=True)
class ParetoPoint:
    name: str
    latency_ms: float
    quality: float


def front(points: list[ParetoPoint]) -> list[str]:
    """Names of the points no other point beats on both axes (lower latency, higher quality)."""
    out = []
    for p in points:
        dominated = any(q.latency_ms <= p.latency_ms and q.quality >= p.quality
                        and (q.latency_ms < p.latency_ms or q.quality > p.quality)
                        for q in points)
        if not dominated:
            out.append(p.name)
    return out


def plot(points: list[ParetoPoint], path: Path, *, title: str, xlabel: str, ylabel: str) -> Path:
    """Scatter every point, join the front, label each; PNG or SVG by the file suffix."""
    if path.suffix.lower() not in (".png", ".svg"):
        raise BadUsageError(f"plot {path}: use a .png or .svg file name")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = set(front(points))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for p in points:
            ax.scatter(p.latency_ms, p.quality, color="C0" if p.name in best else "C7", zorder=3)
            ax.annotate(p.name, (p.latency_ms, p.quality), textcoords="offset points",
                        xytext=(5, 4), fontsize=8)
        fr = sorted((p for p in points if p.name in best), key=lambda p: p.latency_ms)
        if len(fr) > 1:
            ax.plot([p.latency_ms for p in fr], [p.quality for p in fr], color="C0", lw=1,
                    label="Pareto front")
            ax.legend(loc="lower right")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
