"""The tabular loop's checkpoint hook: resume before the first step, save on the interval after
each step (a fixed one, or Daly's from a save measured early in the run), report what it did.

Every call is collective where the store's protocol is (barriers around the resume; the saves
gather state on rank 0), so every rank calls each at the same step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from scalelab.system.train.checkpoint import STATE_FILE, CheckpointStore, rng_state, set_rng_state
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.rank import Rank
from scalelab.system.train.saver import Saver, daly_interval


class Replica(Protocol):
    """What a checkpoint reads and restores of the rank's model (`loop.Replica` is one): a
    protocol, so the loop that calls the checkpointer is not imported back."""

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler: ...

    def load(self, model: dict[str, Any], optimizer: dict[str, Any],
             scheduler: dict[str, Any]) -> None: ...

    def full_model_state(self) -> dict[str, Any]: ...

    def full_optimizer_state(self) -> dict[str, Any]: ...


def agree_max(d: Rank, values: list[float]) -> list[float]:
    """The elementwise max over ranks, so every rank takes the same decision."""
    if not d.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(x) for x in t]


class Checkpointer:
    """Checkpoints of one tabular run on one rank (a no-op when the run takes none)."""

    def __init__(self, cfg: TabularRunConfig, d: Rank, rep: Replica, *, run_dir: Path,
                 total: int) -> None:
        self.cfg, self.d, self.rep, self.total = cfg, d, rep, total
        self.store = CheckpointStore(cfg.checkpoint_dir or run_dir / "checkpoints", keep=cfg.keep)
        self.run_key = cfg.run_key(d.world)
        self.saver = Saver(self.store, rank=d.rank, world=d.world, distributed=d.distributed,
                           asynchronous=cfg.async_checkpoint,
                           run=self.run_key) if cfg.checkpoints_on() else None
        self.every = cfg.checkpoint_every or (max(1, total // 4) if cfg.rehearse_failure else 0)
        self.auto_probe = min(max(2, total // 10), total - 1) if cfg.checkpoint_auto else -1
        self.save_cost: float | None = None
        self.resumed: dict[str, Any] | None = None
        self.skipped: list[dict[str, Any]] = []

    def resume(self) -> tuple[int, list[list[float]]]:
        """(first step to train, the losses up to it) from the newest good checkpoint."""
        start, losses, d, store = 0, [], self.d, self.store
        if self.saver is not None:
            if d.rank == 0:
                store.clean_tmp()
            d.barrier()
            good, skipped = store.latest_good(self.run_key) if self.cfg.resume else (None, [])
            self.skipped = [vars(s) for s in skipped]
            if good is not None:
                t0 = time.perf_counter()
                state = store.load(good, STATE_FILE)
                mine = store.load(good, f"rank-{d.rank}.pt")
                self.rep.load(state["model"], state["optimizer"], state["scheduler"])
                set_rng_state(mine["rng"])
                start, losses = int(state["step"]), list(mine["losses"])
                self.resumed = {"step": good, "load_s": time.perf_counter() - t0}
            d.barrier()
            if d.rank == 0:
                # A kill between a commit's rename and its prune leaves keep + 1 checkpoints;
                # when that was the run's last save, nothing after the resume would prune them.
                store.prune(also_keep=good)
        d.barrier()
        return start, losses

    def last_step(self) -> int | None:
        steps = self.store.steps()
        return steps[-1] if steps else None

    def after_step(self, done: int, losses: list[list[float]], step_s: list[float]) -> None:
        """Save when step `done` is on the interval (not after the last step)."""
        if self.saver is None or done >= self.total:
            return
        if done == self.auto_probe:
            self._save(done, losses)
            self.saver.wait()
            cost, per_step = agree_max(self.d, [self.saver.stats.write_s[-1],
                                                float(np.median(step_s))])
            self.save_cost = cost
            self.every = max(1, round(daly_interval(cost, self.cfg.mtbf_s) / max(per_step, 1e-9)))
        elif self.every and done % self.every == 0:
            self._save(done, losses)

    def finish(self) -> None:
        if self.saver is not None:
            self.saver.wait()

    def report(self) -> dict[str, Any] | None:
        s = self.saver
        return None if s is None else {
            "interval_steps": self.every, "auto": self.cfg.checkpoint_auto,
            "save_cost_s": self.save_cost, "asynchronous": self.cfg.async_checkpoint,
            "saves": s.stats.saves, "blocking_s": s.stats.blocking_s, "write_s": s.stats.write_s,
            "bytes": s.stats.bytes, "dir": str(self.store.root),
        }

    def _save(self, step: int, losses: list[list[float]]) -> float:
        assert self.saver is not None
        rep, d = self.rep, self.d
        model, optim = rep.full_model_state(), rep.full_optimizer_state()
        files: dict[str, Any] = {f"rank-{d.rank}.pt": {"rng": rng_state(), "losses": losses,
                                                      "step": step}}
        if d.rank == 0:
            files[STATE_FILE] = {"model": model, "optimizer": optim,
                                 "scheduler": rep.scheduler.state_dict(), "step": step,
                                 "data_position": {"global_step": step}, "world": d.world}
        return self.saver.save(step, files)
