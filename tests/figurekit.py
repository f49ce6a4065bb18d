"""Checks for a command's --plot: the file is a real PNG/SVG, and the figure drew its JSON.

`capture(monkeypatch)` wraps report.figures.save (the one place every --plot writes through):
the real file is still written, and the Figure is kept so a test reads back its lines.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from scalelab.lab.report import figures


def capture(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Figure, Path]]:
    saved: list[tuple[Figure, Path]] = []
    real = figures.save

    def spy(fig: Figure, path: Path) -> Path:
        saved.append((fig, path))
        return real(fig, path)

    monkeypatch.setattr(figures, "save", spy)
    return saved


def assert_image(path: Path) -> None:
    """A PNG matplotlib reads back with pixels in it, or an SVG document that parses."""
    data = path.read_bytes()
    if path.suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(path)
        assert img.shape[0] > 100 and img.shape[1] > 100
    else:
        root = ET.fromstring(data)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"


def lines(ax: Axes) -> dict[str, tuple[list[float], list[float]]]:
    """Every labelled line of `ax`: label -> (x, y)."""
    out = {}
    for ln in ax.get_lines():
        label = str(ln.get_label())
        if not label.startswith("_"):
            out[label] = ([float(v) for v in ln.get_xdata()],  # type: ignore[union-attr]
                          [float(v) for v in ln.get_ydata()])  # type: ignore[union-attr]
    return out
