"""`scalelab train --model transformer` and `train bench --model transformer`: bad input is one
line and exit 2 (no launch); a real run prints one JSON document (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clikit import fails
from scalelab.cli import run
from scalelab.lab.core.records import read_records

SMALL = ["--layers", "2", "--hidden", "32", "--heads", "2", "--kv-heads", "2", "--ffn", "64",
         "--seq", "32", "--tokens", "20000", "--batch", "4"]


def test_transformer_options_need_the_transformer(capsys: pytest.CaptureFixture[str]) -> None:
    assert "add --model transformer" in fails(capsys, "train", "--strategy", "tp")
    assert "add --model transformer" in fails(capsys, "train", "bench", "--micro-batches", "8")


def test_impossible_splits_are_refused_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    assert "divisible by 2" in fails(capsys, "train", "--model", "transformer", "--strategy",
                                     "tp", "--nproc", "2", "--heads", "6", "--kv-heads", "3",
                                     "--hidden", "48")
    assert "one width" in fails(capsys, "train", "--model", "transformer", "--hidden", "64,64")
    assert "at least 3 layers" in fails(capsys, "train", "--model", "transformer",
                                        "--strategy", "pp", "--nproc", "3", *SMALL)
    assert "choose from" in fails(capsys, "train", "bench", "--model", "transformer",
                                  "--strategy", "dp,zz")


@pytest.mark.slow
def test_json_run_and_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "r.jsonl"
    assert run(["train", "--model", "transformer", "--strategy", "fsdp", "--nproc", "2",
                "--steps", "3", *SMALL, "--records", str(rec), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["strategy"] == "fsdp" and d["world"] == 2 and len(d["losses"]) == 3
    assert set(d["ranks"][0]["comm"]) >= {"all_gather", "reduce_scatter"}
    (r,) = read_records(rec)
    assert r.stage == "train.transformer" and r.extras["strategy"] == "fsdp"
    assert r.rate is not None and r.rate > 0


@pytest.mark.slow
def test_bench_sweeps_strategies_against_ddp(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "b.jsonl"
    assert run(["train", "bench", "--model", "transformer", "--strategy", "fsdp,tp",
                "--nproc", "2", "--steps", "3", *SMALL, "--records", str(rec), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    levels = {lv["strategy"]: lv for lv in d["levels"]}
    assert set(levels) == {"fsdp", "tp"}
    assert levels["fsdp"]["vs_ddp_state"] <= 0.5 + 0.10
    assert levels["tp"]["vs_ddp_state"] <= 0.5 + 0.10
    assert len(read_records(rec)) == 2


def test_every_transformer_option_is_documented() -> None:
    from scalelab.cli.train_transformer import TRANSFORMER_KEYS

    doc = (Path(__file__).resolve().parents[3] / "docs" / "parallel.md").read_text(
        encoding="utf-8")
    for key in TRANSFORMER_KEYS:
        assert f"--{key.replace('_', '-')}" in doc, key
