"""A comparison as a table for people (Markdown, HTML), for programs (CSV) and as a figure."""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path

from scalelab.lab.compare.comparison import Comparison, Row

COLUMNS = ("stage", "series", "variable", "level", "metric", "a", "b", "ratio", "lower",
           "upper", "n_a", "n_b", "unit", "basis", "p_different", "p_equivalent", "decision",
           "need")
"""CSV columns: Row's fields, in this order."""

_MARK = {"worse": "✗ worse", "better": "✓ better", "equivalent": "= equivalent",
         "undecided": "? undecided"}


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def cells(r: Row) -> list[str]:
    """The human table's cells: where, metric, A, B, B/A [interval], decision, need."""
    where = f"{r.stage}{'/' + r.series if r.series else ''} {r.variable}={r.level:g}"
    ratio = "—" if r.ratio is None else f"{r.ratio:.3f}"
    if r.lower is not None:
        ratio += f" [{r.lower:.3f}, {'∞' if r.upper is None else f'{r.upper:.3f}'}]"
    return [where, r.metric, _num(r.a), _num(r.b), ratio, _MARK[r.decision], r.need]


HEADER = ["where", "metric", "A", "B", "B/A [95%]", "decision", "what would decide it"]


def summary(c: Comparison) -> str:
    n = c.counts()
    return (f"{len(c.rows)} metrics, {c.comparisons} tests (Holm-corrected, "
            f"{c.confidence:.0%} family-wise), margin ±{c.margin:.3g}: "
            + ", ".join(f"{v} {k}" for k, v in n.items()))


def markdown(c: Comparison) -> str:
    lines = [summary(c), "", "| " + " | ".join(HEADER) + " |",
             "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(x.replace("|", "\\|") for x in cells(r)) + " |"
              for r in c.rows]
    return "\n".join(lines) + "\n"


def to_html(c: Comparison) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join(
        f'<tr class="{r.decision}">' + "".join(f"<td>{html.escape(x)}</td>" for x in cells(r))
        + "</tr>" for r in c.rows)
    return ("<!doctype html><meta charset=utf-8><title>scalelab compare</title>"
            "<style>td,th{padding:2px 8px;text-align:left}.worse{background:#fdd}"
            ".better{background:#dfd}</style>"
            f"<p>{html.escape(summary(c))}</p><table><tr>{head}</tr>{body}</table>\n")


def to_csv(c: Comparison) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in c.rows:
        w.writerow({k: getattr(r, k) for k in COLUMNS})
    return buf.getvalue()


def figure(c: Comparison, path: Path) -> Path:
    """One row per metric: B/A and its interval on a log axis, with 1 and the margin marked."""
    from scalelab.lab.report import figures

    fig, ax = figures.plt.subplots(figsize=(6.4, 0.3 * len(c.rows) + 1.2))
    rows = [r for r in c.rows if r.ratio is not None]
    for i, r in enumerate(rows):
        color = {"worse": "tab:red", "better": "tab:green"}.get(r.decision, "tab:gray")
        x = float(r.ratio or 0.0)
        lo = r.lower if r.lower else x  # no bound: the point alone on that side
        hi = r.upper if r.upper is not None else x
        ax.errorbar([x], [i], xerr=[[x - lo], [hi - x]], fmt="o", color=color, capsize=3)
    ax.set_yticks(range(len(rows)), [f"{r.stage} {r.level:g}: {r.metric}" for r in rows])
    ax.axvline(1.0, color="black", lw=0.8)
    for x in (1.0 - c.margin, 1.0 + c.margin):
        ax.axvline(x, color="black", lw=0.5, ls="--")
    ax.invert_yaxis()
    ax.set_xlabel(f"B / A with {c.confidence:.0%} interval (dashed: ±{c.margin:.3g})")
    ax.set_title("scalelab compare")
    ax.grid(alpha=0.3)
    return figures.save(fig, path)
