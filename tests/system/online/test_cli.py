"""`scalelab online`: replay end to end through the CLI, bad input as exit 2, and (slow) the
serving repository's canary/promote/rollback path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from figurekit import assert_image, capture
from figurekit import lines as drawn_lines
from scalelab.cli import run
from scalelab.layers.nets.feature_version import mismatch


def _replay(tmp: Path, schema: Path, *extra: str) -> list[str]:
    return ["online", "replay", "--log", str(tmp / "log.sqlite"), "--schema", str(schema),
            "--end", "2013-01-08T00", "--bootstrap-days", "4", "--json", *extra]


def test_replay_json_and_decisions(tmp_path: Path, week_schema: Path,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    dec = tmp_path / "decisions.jsonl"
    rec = tmp_path / "records.jsonl"
    saved = capture(monkeypatch)
    code = run(_replay(tmp_path, week_schema, "--policy", "daily", "--lookback-hours", "48",
                       "--decisions", str(dec), "--records", str(rec),
                       "--fault", "corrupt@2013-01-06T15", "--plot", str(tmp_path / "f1.png")))
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    # --plot: macro F1 per month, the JSON's `monthly`, one line named by the policy.
    assert_image(tmp_path / "f1.png")
    [(fig, _)] = saved
    assert drawn_lines(fig.axes[0]) == {"daily": ([float(m["month"]) for m in out["monthly"]],
                                            [m["macro_f1"] for m in out["monthly"]])}
    assert out["monthly"] and out["plot"] == str(tmp_path / "f1.png")
    assert out["ingested"]["events"]["quarantined"] > 0
    assert out["log_totals"]["accepted"] + out["log_totals"]["quarantined"] == \
        out["log_totals"]["received"]
    lines = [json.loads(x) for x in dec.read_text().splitlines()]
    assert lines[0]["action"] == "bootstrap" and len(lines) >= 4
    assert {d["action"] for d in lines} & {"promoted", "refused"}
    assert any(d["action"] == "quarantined" and d["start"].startswith("2013-01-06")
               for d in lines)
    record = json.loads(rec.read_text())
    # The record sits on the online stage's axis, as `online bench` writes it: update attempts
    # per 30 days of replayed (24 h) windows.
    windows = 1 + max(d["window"] for d in lines)
    assert (record["stage"], record["variable"]) == ("online", "updates_per_30d")
    assert record["level"] == pytest.approx((out["promoted"] + out["refused"]) * 30 / windows)
    assert record["series"] == "fixed"
    # a second replay reads the same log (nothing re-ingested)
    code = run(_replay(tmp_path, week_schema, "--policy", "never"))
    again = json.loads(capsys.readouterr().out)
    assert code == 0 and again["ingested"] is None and again["promoted"] == 0


def test_bad_input_exits_2_with_the_fix(tmp_path: Path, week_schema: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_replay(tmp_path, week_schema, "--policy", "hourly")) == 2
    assert "drift:THRESHOLD" in capsys.readouterr().err
    assert run(_replay(tmp_path, week_schema, "--drift-backoff", "0.5")) == 2
    assert "back-off factor must be >= 1" in capsys.readouterr().err
    assert run(["online", "bench", "--drift-backoff", "0", "--out", str(tmp_path / "b")]) == 2
    assert "back-off factor must be >= 1" in capsys.readouterr().err
    assert run(_replay(tmp_path, week_schema, "--fault", "corrupt")) == 2
    assert "KIND@START" in capsys.readouterr().err
    assert run(["online", "ingest", "--log", str(tmp_path / "l.sqlite"), "--schema",
                str(tmp_path / "missing.json")]) == 2
    assert "scalelab data infer" in capsys.readouterr().err
    # the updater options reach each command that takes them
    for cmd in (_replay(tmp_path, week_schema), ["online", "bench", "--out", str(tmp_path / "b")],
                ["online", "calibrate", "--out", str(tmp_path / "c")]):
        assert run([*cmd, "--rollback-tolerance", "1"]) == 2
        assert "tolerances must lie in [0, 1)" in capsys.readouterr().err


@pytest.mark.slow
def test_replay_publishes_through_serve_canary_promote_and_rollback(
        tmp_path: Path, week_schema: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    code = run(_replay(tmp_path, week_schema, "--policy", "daily", "--lookback-hours", "48",
                       "--model-repo", str(repo), "--model", "fl"))
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    versions = sorted(int(p.name) for p in (repo / "fl").iterdir() if p.name.isdigit())
    assert versions == sorted(out["published"].values())
    assert all(mismatch(repo / "fl" / str(v)) is None for v in versions)
    # the daily policy over these 3 days: the bootstrap, then each published candidate went
    # through a canary and `serve promote`; the attempt refused on its holdout published nothing
    assert (out["promoted"], out["refused"], out["rolled_back"]) == (2, 1, 0)
    assert versions == [1, 2, 3]
    routing = json.loads((repo / "fl" / "serving.json").read_text())
    assert routing["candidate"] is None and routing["weight"] == 0.0  # no canary left open
    assert (routing["current"], routing["previous"]) == (3, 2)  # each promotion moved it on


def test_calibrate_json_and_bad_input(tmp_path: Path, week_schema: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = ["online", "calibrate", "--out", str(tmp_path / "cal"), "--schema", str(week_schema),
            "--end", "2013-01-05T00", "--bootstrap-days", "3", "--lookback-hours", "48",
            "--references", "daily", "--thresholds", "50", "--json"]
    assert run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reference"] == "daily" and out["period"]["end"] == "2013-01-05T00"
    assert [t["policy"] for t in out["trials"]] == ["daily", "drift:50"]
    # one window after the bootstrap: daily fine-tunes once, Page-Hinkley has too little
    # evidence to fire, so drift:50 spends nothing and fits the budget
    assert out["trials"][0]["update_samples"] > 0 and out["trials"][1]["update_samples"] == 0
    assert out["policy"] == "drift:50" and out["within_budget"] is True
    assert out["budget_samples"] == out["trials"][0]["update_samples"] / 3
    assert run([*args, "--budget", "0"]) == 2
    err = capsys.readouterr().err
    assert "budget 0.0 must lie in (0, 1]" in err and "Traceback" not in err
    assert run([*args, "--references", "drift"]) == 2
    assert "'drift' must be a fixed period" in capsys.readouterr().err
