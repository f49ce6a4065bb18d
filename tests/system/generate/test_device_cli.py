"""`scalelab generate complete ... --device SPEC`: the same completion in a child held to a
target device (real child processes, the tiny model)."""

from __future__ import annotations

import json
import os

import pytest

from scalelab.cli import run

CPU0 = sorted(os.sched_getaffinity(0))[:1]
TINY = ["generate", "complete", "--model", "tiny", "--kv-cache-bytes", "4MiB",
        "--max-model-len", "128"]


def test_fits_and_reports_ttft_tokens_per_s_rss(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run([*TINY, "Once upon", "--max-tokens", "5", "--plain-weights", "--stop", "zz",
              "--device", "cores=1,memory=2GiB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert doc["fit"] is True and doc["reason"] == ""
    assert doc["profile"]["label"] == "cores=1,memory=2GiB,threads=1"
    assert doc["mechanism"] in ("cgroup2", "rlimit_as")
    assert doc["cpus"] == CPU0 and doc["threads"] == 1
    assert doc["peak_rss_bytes"] > 1 << 20
    res = doc["result"]
    # The child got every option: 5 tokens, plain weights, the tiny model.
    assert res["completion_tokens"] == 5 and res["packed_weights"] is False
    assert res["model"] == "tiny-llama"
    assert res["ttft_s"] > 0 and res["tokens_per_s"] > 0


def test_no_fit_is_exit_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run([*TINY, "x", "--device", "cores=1,memory=48MiB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert doc["fit"] is False and doc["result"] is None
    assert doc["reason"].startswith(("the memory limit refused an allocation: ",
                                     "killed by the cgroup's OOM killer"))


def test_no_fit_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run([*TINY, "x", "--device", "cores=1,memory=48MiB"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "on device cores=1,memory=48MiB,threads=1" in out and "NO" in out


def test_bad_spec_is_exit_2() -> None:
    assert run([*TINY, "x", "--device", "cores=1,ram=1GiB"]) == 2
