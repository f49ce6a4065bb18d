"""`scalelab load --replay/--ramp/--arrival gamma:CV` end to end against a real server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from scalelab.cli import run


def test_replay_and_ramp_send_their_schedules(server: Callable[..., str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    url = server("fast")
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n"
                     + "".join(f"{100 + i / 100:.2f},10,5\n" for i in range(200)))
    assert run(["load", url, "--replay", str(trace), "--speed", "2", "--warmup", "0s",
                "--json"]) == 0
    lv = json.loads(capsys.readouterr().out)["levels"][0]
    assert lv["requests"] == 200 and lv["arrival"] == f"replay:2:{trace}"
    assert lv["offered_rps"] == pytest.approx(200 / (1.99 / 2))
    # constant spacing under the ramp (poisson is the default): the exact count below
    assert run(["load", url, "--ramp", "1s:100,1s:100", "--arrival", "constant", "--warmup",
                "0s", "--json"]) == 0
    lv = json.loads(capsys.readouterr().out)["levels"][0]
    assert lv["requests"] == 150 and lv["arrival"] == "constant+ramp:1s:100,1s:100"
    assert run(["load", url, "--rate", "50", "--duration", "1s", "--arrival", "gamma:2",
                "--warmup", "0s", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["levels"][0]["arrival"] == "gamma:2"


@pytest.mark.parametrize("args", [
    ["--ramp", "1s:10", "--rate", "5"],
    ["--ramp", "1s:10", "--replay", "x.csv"],
    ["--replay", "missing.csv"],
    ["--arrival", "gamma:-1", "--rate", "5"],
    ["--ramp", "1s:10"],  # not longer than the default 1 s warm-up
])
def test_arrival_flags_misused_exit_2(args: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
