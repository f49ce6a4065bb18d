from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.compress.pareto import ParetoPoint, front, plot

PTS = [ParetoPoint(name="fp32", latency_ms=1.0, quality=0.80),
       ParetoPoint(name="int8", latency_ms=1.5, quality=0.80),
       ParetoPoint(name="student", latency_ms=0.3, quality=0.78),
       ParetoPoint(name="bad", latency_ms=0.5, quality=0.70),
       ParetoPoint(name="cache", latency_ms=0.1, quality=0.80)]


def test_front_keeps_only_undominated_points() -> None:
    assert front(PTS) == ["cache"]
    assert front(PTS[:4]) == ["fp32", "student"]


def test_plot_writes_png_and_svg(tmp_path: Path) -> None:
    png = plot(PTS, tmp_path / "p.png", title="t", xlabel="x", ylabel="y")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = plot(PTS, tmp_path / "p.svg", title="t", xlabel="x", ylabel="y")
    assert b"<svg" in svg.read_bytes()[:1000]
    with pytest.raises(BadUsageError):
        plot(PTS, tmp_path / "p.jpg", title="t", xlabel="x", ylabel="y")
