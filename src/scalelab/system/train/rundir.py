"""The run directory both trainers share: what the launcher writes, what each torchrun worker
writes back, and how either side reads the other's files.

The launcher writes config.json and meta.json (plus the trainer's data); each worker writes
rank-<r>.json, rank 0 writes final.safetensors and, while it trains, progress.json (rank 0's
latest step, for live progress); a rehearsed failure leaves failure.json. Every write lands by
rename, so a reader never sees half a document.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from scalelab.lab.core.errors import RunFailedError

CONFIG_FILE = "config.json"
META_FILE = "meta.json"
FINAL_FILE = "final.safetensors"
FAILURE_FILE = "failure.json"
PROGRESS_FILE = "progress.json"
"""Rank 0's latest step, for the launcher's live progress (rewritten at most twice a second)."""
LOG_FILE = "torchrun.log"
PROGRESS_EVERY_S = 0.5


def rank_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}.json"


def write_json(path: Path, obj: object) -> None:
    """Atomically replace `path` with `obj` as JSON."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    tmp.replace(path)


def clear_results(run_dir: Path) -> None:
    """Remove an earlier run's results: in the same folder they would be read as this run's."""
    for stale in [*run_dir.glob("rank-*.json"), run_dir / FAILURE_FILE, run_dir / FINAL_FILE,
                  run_dir / PROGRESS_FILE]:
        stale.unlink(missing_ok=True)


def write_progress(run_dir: Path, *, step: int, total: int, loss: float) -> None:
    """Atomically replace the progress file (a reader never sees half a document)."""
    run_dir.mkdir(parents=True, exist_ok=True)  # the first write may precede any checkpoint's
    write_json(run_dir / PROGRESS_FILE, {"step": step, "total": total, "loss": loss})


def read_progress(run_dir: Path) -> dict[str, Any] | None:
    """The latest progress rank 0 wrote, or None (not started, or a torn read)."""
    try:
        doc = json.loads((run_dir / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class ProgressWriter:
    """Rank 0's progress file, rewritten at most every PROGRESS_EVERY_S and on the last step."""

    def __init__(self, run_dir: Path, *, rank: int, total: int) -> None:
        self.run_dir, self.on, self.total = run_dir, rank == 0, total
        self._last = 0.0

    def step(self, done: int, loss: float) -> None:
        now = time.perf_counter()
        if self.on and (now - self._last >= PROGRESS_EVERY_S or done == self.total):
            write_progress(self.run_dir, step=done, total=self.total, loss=loss)
            self._last = now


def fail_now(run_dir: Path, *, step: int, rank: int, **extra: Any) -> None:
    """A rehearsed failure: record where (fsynced, so the launcher reads it after the kill),
    then SIGKILL this process, as a crashed host would end it."""
    with (run_dir / FAILURE_FILE).open("w", encoding="utf-8") as f:
        json.dump({"step": step, "rank": rank, "time": time.time(), **extra}, f)
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def read_failure(run_dir: Path) -> dict[str, Any] | None:
    p = run_dir / FAILURE_FILE
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def read_rank_reports(run_dir: Path, world: int) -> list[dict[str, Any]]:
    """Every rank's report, rank 0 first; RunFailedError naming the first that is missing."""
    reports = []
    for r in range(world):
        p = rank_file(run_dir, r)
        if not p.is_file():
            raise RunFailedError(f"worker {r} wrote no report ({p}); see {run_dir / LOG_FILE}")
        reports.append(json.loads(p.read_text(encoding="utf-8")))
    return reports


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The full final weights rank 0 wrote."""
    return load_file(str(Path(run_dir) / FINAL_FILE))


def weights_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, float]:
    """(bitwise equal, max |a - b|) of two weight sets; unequal names are inf apart."""
    if a.keys() != b.keys():
        return False, float("inf")
    equal = all(torch.equal(a[k], b[k]) for k in a)
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    return equal, diff
