"""Where a training worker sits, and the life of the process torchrun starts for it.

Both trainers' workers (`scalelab.system.train.worker`, `scalelab.system.train.parallel.worker`) run
the same way: die with the torchrun agent, join the process group (gloo on CPU, nccl on CUDA) as a
`Rank`, train, write their report, then `leave_group` (a barrier first, so no rank tears down a
group another still uses for its last collective) and `exit_now`. In-process runs (world 1, no
process group) use a plain `Rank()`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, kw_only=True)
class Rank:
    """Where this worker sits: rank, world size, whether a process group exists, its device."""

    rank: int = 0
    world: int = 1
    distributed: bool = False
    """A process group exists (a torchrun worker); False for in-process runs of world 1."""
    device: str = "cpu"
    restart: int = 0
    """torchrun's restart count (TORCHELASTIC_RESTART_COUNT): 0 on the first attempt."""

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def join_group(meta: dict[str, Any]) -> Rank:
    """Join torchrun's process group on the device the launcher's meta.json asks for."""
    cuda = bool(meta.get("cuda")) and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=timedelta(seconds=float(meta.get("collective_timeout_s", 300))))
    return Rank(rank=dist.get_rank(), world=dist.get_world_size(), distributed=True,
                device=f"cuda:{local_rank}" if cuda else "cpu",
                restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


def leave_group() -> None:
    """Barrier, then destroy the group: no rank tears it down under another's last collective."""
    dist.barrier()
    dist.destroy_process_group()


def die_with_agent() -> None:
    """SIGKILL this worker when the torchrun agent that started it dies.

    torchrun starts each worker in a session of its own, so a SIGKILLed agent (a killed job, the
    OOM killer, a timeout's SIGKILL) left its workers training on, and writing checkpoints into
    the folder a re-run was already resuming from. Linux only (prctl PR_SET_PDEATHSIG); costs
    nothing while the agent lives.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != parent:  # the agent died before the prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def exit_now(code: int) -> None:
    """End a worker whose process group is already destroyed without interpreter teardown.

    Why: after destroy_process_group, exit could still abort (SIGABRT, "terminate called
    without an active exception") when a C++ thread of gloo or the autograd engine was
    destroyed while joinable during static destruction — seen once in the sharded-optimizer
    test, after the rank had written its report. Every file this worker writes is closed by
    then, so only the standard streams need flushing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
