"""Distributed checkpoints of the transformer (torch.distributed.checkpoint), resumable under
another strategy or world size.

DCP stores every tensor by its fully qualified name with its global shape; each rank writes
the shards it holds and reads the ones it needs, so a checkpoint written by FSDP over 2 ranks
loads into DDP, TP or a pipeline stage (which keeps the full model's names, see pipeline.py).
The optimizer state is keyed by parameter names too (`get_state_dict`), not by position.

Commit protocol: every rank writes into ROOT/.step-N.tmp/; after a barrier rank 0 writes
scalelab.json (step, run key, world, strategy), fsyncs, renames the folder to ROOT/step-N and
fsyncs ROOT. A folder without the marker, or a `.tmp`, is never loaded; a marker with another
run key (model size, data, batch, learning rate, seed) is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scalelab.system.train.checkpoint import fsync_dir

MARKER = "scalelab.json"
_PREFIX = "step-"


def complete_steps(root: Path, run_key: str) -> list[int]:
    """Steps of the complete checkpoints of this run, oldest first."""
    if not root.is_dir():
        return []
    steps = []
    for p in root.glob(f"{_PREFIX}*"):
        marker = p / MARKER
        if not marker.is_file():
            continue
        try:
            meta = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if meta.get("run") == run_key:
            steps.append(int(meta["step"]))
    return sorted(steps)


def step_dir(root: Path, step: int) -> Path:
    return root / f"{_PREFIX}{step:08d}"


def save(root: Path, step: int, model: nn.Module, optimizer: Optimizer, *, run_key: str,
         rank: int, meta: dict[str, Any]) -> None:
    """Collective: every rank calls it at the same step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tmp = root / f".{_PREFIX}{step:08d}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    dist.barrier()
    if rank == 0:
        marker = tmp / MARKER
        with marker.open("w", encoding="utf-8") as f:
            json.dump({"step": step, "run": run_key, **meta}, f)
            f.flush()
            os.fsync(f.fileno())
        final = step_dir(root, step)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        fsync_dir(root)
    dist.barrier()


def load(root: Path, step: int, model: nn.Module, optimizer: Optimizer) -> None:
    """Collective: read step `step` into this rank's (possibly sharded) model and optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(step_dir(root, step)))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    # Pipeline stages hold different parameters, and DCP brought back their param groups
    # without the non-tensor hyperparameters (AdamW's `betas` went missing on stage 0, seen with
    # torch 2.13): they are the run's settings, so the optimizer's own defaults fill them in.
    for group in optimizer.param_groups:
        for k, v in optimizer.defaults.items():
            group.setdefault(k, v)


class Checkpoints:
    """The loop's checkpoint hook: resume from the newest complete checkpoint before the first
    step, save every `every` steps after (not after the last: the final weights are saved)."""

    def __init__(self, *, every: int, resume: bool, root: Path, run_key: str, rank: int,
                 total: int, meta: dict[str, Any]) -> None:
        self.every, self.do_resume, self.root, self.run_key = every, resume, root, run_key
        self.rank, self.total, self.meta = rank, total, meta

    def resume(self, model: nn.Module, optimizer: Optimizer) -> tuple[int, dict[str, Any] | None]:
        """(first step to train, {"step", "load_s"} of the checkpoint resumed or None)."""
        found = complete_steps(self.root, self.run_key) if self.do_resume and self.every else []
        if not found:
            return 0, None
        t0 = time.perf_counter()
        load(self.root, found[-1], model, optimizer)
        return found[-1], {"step": found[-1], "load_s": time.perf_counter() - t0}

    def after_step(self, done: int, model: nn.Module, optimizer: Optimizer) -> None:
        if self.every and done % self.every == 0 and done < self.total:
            save(self.root, done, model, optimizer, run_key=self.run_key, rank=self.rank,
                 meta=self.meta)
