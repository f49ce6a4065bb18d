"""--plot FILE on fit usl, fit chinchilla and sweep: a real PNG/SVG whose data is the JSON's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from figurekit import assert_image, capture, lines
from scalelab.cli import run
from scalelab.lab.core.usl import usl
from scalelab.layers.plan.chinchilla import ChinchillaParams, compute_optimal

EPOCH_CSV = (Path(__file__).resolve().parents[1] / "layers" / "plan" / "data"
             / "chinchilla_epoch.csv")


def _usl_csv(tmp_path: Path) -> Path:
    csv = tmp_path / "t.csv"
    rows = ["workers,rps"]
    for n in range(1, 9):
        rows.append(f"{n},{10 * n / (1 + 0.1 * (n - 1) + 0.01 * n * (n - 1))!r}")
    csv.write_text("\n".join(rows) + "\n")
    return csv


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_fit_usl_plot_draws_the_json(tmp_path: Path, suffix: str,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    saved = capture(monkeypatch)
    out = tmp_path / f"usl{suffix}"
    assert run(["fit", "usl", "--csv", str(_usl_csv(tmp_path)), "--plot", str(out),
                "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plot"] == str(out)
    assert_image(out)
    [(fig, path)] = saved
    assert path == out
    drawn = lines(fig.axes[0])
    assert drawn["rps"] == ([p["x"] for p in data["points"]], [p["y"] for p in data["points"]])
    # The dashed line is the chosen law with the JSON's parameters.
    gx, gy = drawn["rps: usl fit"]
    u = data["usl"]
    want = usl(np.asarray(gx), u["gamma"]["value"], u["alpha"]["value"], u["beta"]["value"])
    assert gy == pytest.approx(want.tolist(), rel=1e-9)
    assert gx[0] == 1.0 and gx[-1] == 8.0


def test_fit_chinchilla_plot_draws_the_fitted_law(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    saved = capture(monkeypatch)
    out = tmp_path / "c.png"
    assert run(["fit", "chinchilla", "--csv", str(EPOCH_CSV), "--drop-highest", "5",
                "--grid-points", "2", "--bootstrap", "0", "--plot", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert_image(out)
    [(fig, _)] = saved
    ax = fig.axes[0]
    runs = ax.collections[0].get_offsets()
    assert len(runs) == d["n_points"] == 240
    cx, cy = lines(ax)["fitted law, compute-optimal"]
    params = ChinchillaParams(**{k: d[k] for k in ("E", "A", "B", "alpha", "beta")})
    assert cy == pytest.approx([compute_optimal(params, c).loss for c in cx], rel=1e-12)
    assert cx[0] == pytest.approx(float(np.min(runs[:, 0])))
    assert cx[-1] == pytest.approx(float(np.max(runs[:, 0])))


def test_sweep_plot_draws_the_level_medians(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    saved = capture(monkeypatch)
    out = tmp_path / "s.svg"
    # The metric is the level itself (printed as JSON), so the medians are exact.
    code = "import json,sys; print(json.dumps({'rate': 3 * float(sys.argv[1])}))"
    assert run(["sweep", "--var", "n=1,2,4", "--metric", "json:rate", "--records",
                str(tmp_path / "r.jsonl"), "--plot", str(out), "--json", "--",
                sys.executable, "-c", code, "{n}"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert_image(out)
    [(fig, _)] = saved
    [(x, y)] = [v for k, v in lines(fig.axes[0]).items() if not k.endswith("fit")]
    assert x == [lv["level"] for lv in data["levels"]] == [1.0, 2.0, 4.0]
    assert y == [lv["throughput_median"] for lv in data["levels"]] == [3.0, 6.0, 12.0]


@pytest.mark.parametrize("name", ["plot.pdf", "plot"])
def test_plot_with_no_image_suffix_exits_2_before_any_work(
        tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["fit", "usl", "--csv", str(_usl_csv(tmp_path)), "--plot",
                str(tmp_path / name)]) == 2
    cap = capsys.readouterr()
    assert "use a file name ending in .png or .svg" in cap.err and cap.out == ""
    assert not (tmp_path / name).exists()
