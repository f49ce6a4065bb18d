"""The --plot of `load run` / `load llm run`: what it draws is what the levels say."""

from __future__ import annotations

from scalelab.lab.report.figures import plt
from scalelab.lab.report.levels_figure import levels_figure


def test_each_level_is_a_cdf_and_the_quantiles_follow_the_load() -> None:
    levels = [
        {"offered_rps": 10.0, "latency": {"p50_ms": 1.0, "p90_ms": 2.0, "p95_ms": 3.0,
                                          "p99_ms": 4.0, "p999_ms": 5.0, "max_ms": 6.0}},
        {"offered_rps": 20.0, "latency": {"p50_ms": 2.0, "p90_ms": 4.0, "p95_ms": 6.0,
                                          "p99_ms": None, "p999_ms": None, "max_ms": 9.0}},
    ]
    fig = levels_figure(levels, metric="latency", title="t")
    cdf, curve = fig.axes
    first, second = cdf.get_lines()
    assert list(first.get_xdata()) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert list(first.get_ydata()) == [0.5, 0.9, 0.95, 0.99, 0.999, 1.0]
    assert list(second.get_xdata()) == [2.0, 4.0, 6.0, 9.0]  # unrecorded quantiles left out
    p50, p95, p99 = curve.get_lines()
    assert list(p50.get_xdata()) == [10.0, 20.0] and list(p95.get_ydata()) == [3.0, 6.0]
    ys = list(p99.get_ydata())
    assert ys[0] == 4.0 and ys[1] != ys[1]  # the second level's p99 is NaN: not recorded
    assert curve.get_xlabel() == "offered load (requests/s)"
    plt.close(fig)
