"""The run directory both trainers share: stale results cleared, reports read back or a clear
error, progress from rank 0 only, a rehearsed failure recorded before the process dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.lab.core.errors import RunFailedError
from scalelab.system.train.rundir import (
    FAILURE_FILE,
    FINAL_FILE,
    PROGRESS_FILE,
    ProgressWriter,
    clear_results,
    rank_file,
    read_failure,
    read_progress,
    read_rank_reports,
    weights_diff,
    write_json,
)


def test_stale_results_go_and_the_inputs_stay(tmp_path: Path) -> None:
    for name in ("rank-0.json", "rank-1.json", FAILURE_FILE, FINAL_FILE, PROGRESS_FILE,
                 "config.json", "meta.json"):
        (tmp_path / name).write_text("{}", encoding="utf-8")
    clear_results(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "meta.json"]


def test_reports_are_read_in_rank_order_or_the_missing_one_is_named(tmp_path: Path) -> None:
    write_json(rank_file(tmp_path, 0), {"rank": 0})
    write_json(rank_file(tmp_path, 1), {"rank": 1})
    assert read_rank_reports(tmp_path, 2) == [{"rank": 0}, {"rank": 1}]
    with pytest.raises(RunFailedError, match=r"worker 2 wrote no report .*torchrun\.log"):
        read_rank_reports(tmp_path, 3)
    assert not list(tmp_path.glob(".*.tmp"))  # every write landed by rename


def test_progress_comes_from_rank_0_and_always_marks_the_last_step(tmp_path: Path) -> None:
    ProgressWriter(tmp_path / "r1", rank=1, total=3).step(3, 0.5)
    assert read_progress(tmp_path / "r1") is None
    w = ProgressWriter(tmp_path, rank=0, total=3)
    w.step(1, 2.0)
    assert read_progress(tmp_path) == {"step": 1, "total": 3, "loss": 2.0}
    w.step(3, 1.5)
    assert read_progress(tmp_path) == {"step": 3, "total": 3, "loss": 1.5}


def test_weights_diff_is_exact() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    assert weights_diff(a, {k: v.clone() for k, v in a.items()}) == (True, 0.0)
    assert weights_diff(a, {"w": torch.tensor([1.0, 2.5]), "b": torch.tensor([0.0])}) == (
        False, 0.5)
    assert weights_diff(a, {"w": a["w"]}) == (False, float("inf"))


def test_a_rehearsed_failure_is_recorded_then_the_process_is_killed(tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; "
            "from scalelab.system.train.rundir import fail_now; "
            "fail_now(Path(sys.argv[1]), step=7, rank=1, last_checkpoint=6); print('alive')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, env=env, check=False)
    assert out.returncode == -9 and "alive" not in out.stdout
    doc = read_failure(tmp_path)
    assert doc is not None
    assert (doc["step"], doc["rank"], doc["last_checkpoint"]) == (7, 1, 6)
    assert json.loads((tmp_path / FAILURE_FILE).read_text(encoding="utf-8")) == doc
    assert read_failure(tmp_path / "none") is None
