"""A load run's levels as one figure: each level's latency distribution (its recorded quantiles,
p50 to max, as a CDF) beside the latency quantiles against the offered load.

Drawn from a run's JSON document (`load run`, `load llm run`: what --json prints), so the
figure shows exactly what the table shows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from scalelab.lab.report import figures

QUANTILES = (("p50_ms", 0.5), ("p90_ms", 0.9), ("p95_ms", 0.95), ("p99_ms", 0.99),
             ("p999_ms", 0.999), ("max_ms", 1.0))


def level_x(level: Mapping[str, Any]) -> tuple[str, float]:
    """(variable, value) of one level: offered requests/s in open loop, clients in closed."""
    if level.get("offered_rps") is not None:
        return "offered load (requests/s)", float(level["offered_rps"])
    return "concurrency (clients)", float(level.get("concurrency") or 0)


def levels_figure(levels: Sequence[Mapping[str, Any]], *, metric: str,
                  title: str) -> Figure:
    """`metric` is the levels' key holding the percentiles: "latency" (load), "ttft" (llm)."""
    fig, (cdf, curve) = figures.plt.subplots(1, 2, figsize=(9.6, 3.4))
    xs: list[float] = []
    per_q: dict[str, list[float]] = {"p50": [], "p95": [], "p99": []}
    variable = "level"
    for lv in levels:
        pct = lv.get(metric) or {}
        variable, x = level_x(lv)
        pts = [(pct.get(k), q) for k, q in QUANTILES if pct.get(k) is not None]
        if pts:
            cdf.step([v for v, _ in pts], [q for _, q in pts], where="post", marker="o",
                     label=f"{x:g}")
        xs.append(x)
        for q in per_q:
            v = pct.get(f"{q}_ms")
            per_q[q].append(math.nan if v is None else float(v))
    cdf.set_xscale("log")
    cdf.set_xlabel(f"{metric} (ms)")
    cdf.set_ylabel("quantile")
    cdf.set_title(f"{metric} distribution per level")
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize=7, title=variable.split(" ")[0], title_fontsize=7)
    for q, ys in per_q.items():
        curve.plot(xs, ys, marker="o", linestyle={"p50": ":", "p95": "-", "p99": "--"}[q],
                   label=q)
    curve.set_yscale("log")
    curve.set_xlabel(variable)
    curve.set_ylabel(f"{metric} (ms)")
    curve.set_title(title)
    curve.grid(alpha=0.3, which="both")
    curve.legend(fontsize=7)
    return fig
