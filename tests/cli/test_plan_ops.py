"""`scalelab plan hpa | checkpoint | lr`: outputs, JSON, the documented state file, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clikit import fails, run_json
from scalelab.cli import run

DOC = Path(__file__).resolve().parents[2] / "docs" / "plan-ops.md"


def test_hpa_simple_form_gives_6(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "hpa", "--current", "4", "--observed", "90", "--target", "60"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("desired replicas: 6 (current 4, scale up)")
    d = run_json(capsys, "plan", "hpa", "--current", "4", "--observed", "90", "--target", "60")
    assert (d["desired_replicas"], d["reason"], d["usage_ratio"]) == (6, "DesiredWithinRange",
                                                                     1.5)


def test_hpa_simple_form_options(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "hpa", "--current", "4", "--target", "60"]
    d = run_json(capsys, *base, "--observed", "65")
    assert (d["desired_replicas"], d["reason"]) == (4, "WithinTolerance")
    d = run_json(capsys, *base, "--observed", "65", "--scale-up-tolerance", "0.05")
    assert (d["desired_replicas"], d["tolerances"]) == (5, [0.1, 0.05])
    d = run_json(capsys, *base, "--observed", "90", "--max", "5")
    assert (d["desired_replicas"], d["reason"]) == (5, "TooManyReplicas")
    d = run_json(capsys, *base, "--observed", "600")
    assert (d["desired_replicas"], d["reason"]) == (8, "ScaleUpLimit")
    d = run_json(capsys, "plan", "hpa", "--current", "3", "--observed", "150", "--target",
                 "100", "--target-type", "AverageValue")
    assert d["desired_replicas"] == 5
    d = run_json(capsys, "plan", "hpa", "--current", "2", "--observed", "250", "--target",
                 "100", "--target-type", "Value", "--max", "20")
    assert (d["proposal"], d["desired_replicas"]) == (5, 4)


def test_hpa_state_file_from_the_docs(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    m = re.search(r"```json\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.S)
    assert m, "plan-ops.md lost its example state"
    f = tmp_path / "hpa.json"
    f.write_text(m.group(1), encoding="utf-8")
    d = run_json(capsys, "plan", "hpa", "--state", str(f))
    assert (d["proposal"], d["stabilized"], d["desired_replicas"], d["reason"]) == (
        8, 8, 7, "ScaleUpLimit")
    metric = d["metrics"][0]
    assert (metric["unready_pods"], metric["missing_pods"]) == (["web-4", "web-5"], ["web-3"])
    assert run(["plan", "hpa", "--state", str(f)]) == 0
    assert "desired replicas: 7" in capsys.readouterr().out


def test_hpa_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = fails(capsys, "plan", "hpa", "--current", "-1", "--observed", "90", "--target", "60")
    assert "--current must be >= 0" in line
    line = fails(capsys, "plan", "hpa", "--current", "4", "--observed", "90", "--target", "0")
    assert "--target must be > 0" in line
    assert "--current" in fails(capsys, "plan", "hpa", "--observed", "90", "--target", "60")
    bad = tmp_path / "bad.json"
    bad.write_text('{"current_replicas": 4,', encoding="utf-8")
    assert "not valid JSON (line 1" in fails(capsys, "plan", "hpa", "--state", str(bad))
    bad.write_text(json.dumps({"current_replicas": 4, "max_replicas": 10,
                               "metrics": [{"target": 60}],
                               "pods": [{"usage": {"cpu": "x"}}]}), encoding="utf-8")
    line = fails(capsys, "plan", "hpa", "--state", str(bad))
    assert "state.pods[0].usage.cpu: must be a number" in line
    bad.write_text(json.dumps({"current_replicas": -2, "max_replicas": 10,
                               "metrics": [{"target": 60}]}), encoding="utf-8")
    assert "current_replicas must be an integer >= 0" in fails(capsys, "plan", "hpa",
                                                               "--state", str(bad))
    assert "drop --current" in fails(capsys, "plan", "hpa", "--state", str(bad),
                                     "--current", "3")
    assert "no such file" in fails(capsys, "plan", "hpa", "--state", str(tmp_path / "nope"))


def test_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    p = run_json(capsys, "plan", "checkpoint", "--save-cost", "5m", "--mtbf", "24h")
    assert p["young"]["interval_s"] == 7200.0
    assert p["daly"]["interval_s"] == pytest.approx(7000 + 25 / 18, rel=1e-14)
    assert p["young"]["wall_time_s"] is None
    p = run_json(capsys, "plan", "checkpoint", "--save-cost", "5m", "--mtbf", "24h",
                 "--restart", "10m", "--work", "500h")
    assert p["young"]["checkpoints"] == 250.0 and p["work_s"] == 1_800_000.0
    assert run(["plan", "checkpoint", "--save-cost", "5m", "--mtbf", "24h"]) == 0
    assert "Young" in capsys.readouterr().out


def test_checkpoint_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--mtbf: '24x' is not a duration" in fails(
        capsys, "plan", "checkpoint", "--save-cost", "5m", "--mtbf", "24x")
    assert "positive duration" in fails(capsys, "plan", "checkpoint", "--save-cost", "0s",
                                        "--mtbf", "24h")
    assert "--save-cost" in fails(capsys, "plan", "checkpoint", "--mtbf", "24h")


def test_lr(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "lr", "--base-lr", "0.1", "--base-batch", "256", "--batch", "8192",
            "--warmup-epochs", "5"]
    d = run_json(capsys, *args, "--steps-per-epoch", "100")
    assert (d["scaled_lr"], d["k"], d["warnings"], d["warmup_steps"]) == (3.2, 32.0, [], 500.0)
    assert [r["lr"] for r in d["schedule"]] == pytest.approx([0.1, 0.72, 1.34, 1.96, 2.58, 3.2])
    assert d["increment_per_step"] == pytest.approx(3.1 / 500)
    assert run(args) == 0
    cap = capsys.readouterr()
    assert "scaled lr: 3.2" in cap.out and cap.err == ""


def test_lr_warns_past_8k_on_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["plan", "lr", "--base-lr", "0.1", "--base-batch", "256", "--batch", "16384",
              "--json"])
    cap = capsys.readouterr()
    assert rc == 0 and "warning:" in cap.err and "8192" in cap.err
    assert json.loads(cap.out)["scaled_lr"] == 6.4


def test_lr_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--batch must be an integer >= 1" in fails(
        capsys, "plan", "lr", "--base-lr", "0.1", "--base-batch", "256", "--batch", "0")
    assert "--base-lr must be a number > 0" in fails(
        capsys, "plan", "lr", "--base-lr", "-1", "--base-batch", "256", "--batch", "512")
