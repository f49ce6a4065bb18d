"""Writing a checkpoint from every rank, synchronously or in the background, and how often.

Sync: every rank writes its files, a barrier, rank 0 commits; training waits for all of it.
Async: the step only waits for a CPU snapshot of the state (and for the previous save to
finish); a background thread writes the files and coordinates the commit over its own gloo
process group — on the training group its barrier would interleave with DDP's all-reduces from
the main thread and deadlock or corrupt both.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from scalelab.lab.core.checkpoint import daly_interval
from scalelab.system.train.checkpoint import (
    CheckpointStore,
    crash_point,
    save_file_durably,
    write_torn,
)

__all__ = ["SaveStats", "Saver", "clone_state", "daly_interval"]


def clone_state(obj: Any) -> Any:
    """A deep copy of the tensors in a state so training can move on while it is written."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: clone_state(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_state(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clone_state(v) for v in obj)
    return obj


@dataclass(kw_only=True)
class SaveStats:
    saves: int = 0
    blocking_s: list[float] = field(default_factory=list)
    """Seconds the training loop waited per save (snapshot + waiting on the previous save)."""
    write_s: list[float] = field(default_factory=list)
    """Seconds from snapshot to committed checkpoint, per save (background for async)."""
    bytes: int = 0


class Saver:
    """Saves a dict {file name: state} per rank as one checkpoint of `store`."""

    def __init__(self, store: CheckpointStore, *, rank: int, world: int, distributed: bool,
                 asynchronous: bool, run: str | None = None) -> None:
        self.store, self.rank, self.world, self.run = store, rank, world, run
        self.distributed, self.asynchronous = distributed, asynchronous
        self.stats = SaveStats()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # Collective: every rank creates the group at the same point, before any save.
        self._group = (dist.new_group(backend="gloo") if distributed and asynchronous
                       else None)

    def _barrier(self, background: bool) -> None:
        if self.distributed:
            dist.barrier(group=self._group if background else None)

    def _write(self, step: int, files: dict[str, Any], started: float, background: bool) -> None:
        try:
            d = self.store.begin(step)
            for i, (name, obj) in enumerate(files.items()):
                if i == 0:
                    crash_point("ckpt-torn", step, self.rank,
                                before=lambda: write_torn(obj, d / name))  # noqa: B023
                save_file_durably(obj, d / name)
            crash_point("ckpt-written", step, self.rank)
            self._barrier(background)
            if self.rank == 0:
                final = self.store.commit(step, meta={"world": self.world, "run": self.run})
                self.stats.bytes = self.store.size_bytes(int(final.name.split("-")[1]))
            self._barrier(background)
            self.stats.write_s.append(time.perf_counter() - started)
        except BaseException as e:  # surfaced on the next wait(); a thread cannot raise
            self._error = e

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"background checkpoint save failed: {err}") from err

    def save(self, step: int, files: dict[str, Any]) -> float:
        """Save; returns the seconds the caller was blocked."""
        t0 = time.perf_counter()
        self.wait()
        if self.asynchronous:
            snap = clone_state(files)
            self._thread = threading.Thread(target=self._write, args=(step, snap, t0, True),
                                            name=f"ckpt-{step}", daemon=True)
            self._thread.start()
        else:
            self._write(step, files, t0, False)
            if self._error is not None:
                self.wait()
        blocked = time.perf_counter() - t0
        self.stats.saves += 1
        self.stats.blocking_s.append(blocked)
        return blocked
