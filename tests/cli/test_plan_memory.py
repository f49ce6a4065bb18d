"""`scalelab plan memory`: one JSON document with the core's numbers; bad input is exit 2."""

from __future__ import annotations

import json

import pytest

from scalelab.cli import run

ARGS = ["plan", "memory", "--params", "1000000", "--layers", "4", "--hidden", "128", "--seq",
        "128", "--batch", "8", "--vocab", "256"]


def test_json_is_one_document_with_fsdp_shards(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*ARGS, "--strategy", "fsdp", "--world", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["params_per_rank"], d["param_bytes"], d["optimizer_bytes"]) == (250_000, 1_000_000,
                                                                             2_000_000)
    assert d["formulas"]["state_variant"] == "fp32 Adam: 4Ψ + 4Ψ + 8Ψ"


def test_table_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*ARGS, "--strategy", "tp", "--world", "2"]) == 0
    assert "memory per rank: tp over 2 rank(s), fp32" in capsys.readouterr().out
    assert run([*ARGS, "--strategy", "pp", "--world", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least as many layers" in err[0]


def test_peak_rss_adds_a_given_runtime_to_the_tensors(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*ARGS, "--strategy", "dp", "--world", "4", "--runtime-bytes", "300000000",
                "--data-bytes", "1000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # tests/lab/core/test_memory.py: tensors 27,654,144 bytes, DDP's bucket 4,000,000.
    assert d["peak_rss"]["peak_rss_bytes"] == 300_000_000 + 1_000 + 27_654_144 + 4_000_000
    assert d["peak_rss"]["baseline"] is None
    assert run([*ARGS, "--strategy", "dp", "--world", "4", "--runtime-bytes", "-1"]) == 2
    assert "--runtime-bytes" in capsys.readouterr().err
