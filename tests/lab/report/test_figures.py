"""The report draws the commands' --plot figures from records: same function, same numbers."""

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from recordkit import M, rec
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.report import plots
from scalelab.lab.report.document import write_report

GRID = {"hnswlib:M=16": [{"recall": 0.9, "qps": 900.0}, {"recall": 0.99, "qps": 400.0}],
        "exact": [{"recall": 1.0, "qps": 50.0}]}
MONTHLY = {"never": [{"month": 1, "macro_f1": 0.5}, {"month": 2, "macro_f1": 0.4}],
           "daily": [{"month": 1, "macro_f1": 0.5}, {"month": 2, "macro_f1": 0.55}]}


def _records() -> list[Record]:
    out = [rec("retrieval", "corpus_multiple", 1.0, rate=10.0, p95=5.0,
               extras={"index": name, "series": name, "grid": grid})
           for name, grid in GRID.items()]
    out += [rec("online", "updates_per_30d", float(i), rate=100.0,
                extras={"policy": policy, "series": policy, "monthly": months})
            for i, (policy, months) in enumerate(MONTHLY.items())]
    return out


def test_report_draws_the_frontier_and_f1_over_time(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: dict[str, object] = {}
    for name in ("frontier_figure", "timeline_figure"):
        real = getattr(plots, name)

        def spy(series: object, *, _real=real, _name=name, **kw: object) -> Figure:
            drawn[_name] = series
            return _real(series, **kw)  # type: ignore[no-any-return]

        monkeypatch.setattr(plots, name, spy)
    records = _records()
    sheet = build_sheet(records)
    goals = [StageGoal(stage="retrieval", objectives=[Objective(metric="rate", min=1)]),
             StageGoal(stage="online", objectives=[Objective(metric="rate", min=1)])]
    verdict = judge(goals, sheet, cores=M.cores, memory_bytes=M.memory_bytes)
    page = write_report(tmp_path, sheet, verdict, goals, M, {"mode": "quick"},
                        records=records).html.read_text()
    assert "retrieval: recall vs QPS" in page
    assert "online: quality over time per update policy" in page
    assert drawn["frontier_figure"] == {
        f"{name} x1": [(p["recall"], p["qps"]) for p in grid] for name, grid in GRID.items()}
    assert drawn["timeline_figure"] == {
        policy: [(float(m["month"]), m["macro_f1"]) for m in months]
        for policy, months in MONTHLY.items()}


def test_no_records_no_extra_figures() -> None:
    assert plots.frontier_plot("retrieval", []) is None
    assert plots.monthly_plot("online", []) is None


def test_log_axes_label_plain_numbers_in_the_font_family_list() -> None:
    """A log axis's ticks are plain text ("10", "100"), every SVG text carries the family list
    ending in a generic family (a browser without DejaVu Sans still draws sans-serif)."""
    import re

    from scalelab.lab.report.figures import LatencyCurve, latency_figure

    fig = latency_figure([LatencyCurve(name="s", x=[1.0, 2.0, 5.0],
                                       quantiles={"p95": [8.0, 30.0, 900.0]})],
                         variable="rate", title="t")
    fig.canvas.draw()
    labels = {t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()}
    assert {"10", "100"} <= labels and not any("$" in t for t in labels)
    svg = plots._svg(fig)
    assert "mathdefault" not in svg
    families = set(re.findall(r"font-family: ([^;\"]+)", svg))
    assert families and all(f.rstrip().endswith("sans-serif") for f in families), families
