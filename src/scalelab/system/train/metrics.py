"""What a step costs: time per phase, FLOPs, memory, optimizer-state bytes, cost.

Phase times are wall-clock per worker. Communication is timed inside a DDP comm hook (from the
moment DDP hands the gradient bucket to gloo until the all-reduce future completes); the trainer
puts all gradients in one bucket, so the all-reduce starts only after backward computed every
gradient and cannot overlap it: backward = backward wall time - all-reduce time, exactly. For the
tiny tabular nets here, losing DDP's bucket overlap costs nothing measurable; for large models
the split would undercount overlap. FSDP's collectives run inside forward and backward and are
reported as part of them (comm = None).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

PHASES = ("data", "forward", "backward", "comm", "optimizer")


@dataclass(kw_only=True)
class StepTimes:
    """Seconds spent per phase over the measured steps (summed)."""

    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: int = 0
    wall: float = 0.0
    per_step: list[float] = field(default_factory=list)

    def add(self, phase: str, seconds: float) -> None:
        self.totals[phase] += seconds

    def mean_ms(self) -> dict[str, float]:
        return {k: 1e3 * v / self.steps if self.steps else 0.0 for k, v in self.totals.items()}

    def shares(self) -> dict[str, float]:
        total = sum(self.totals.values())
        return {k: v / total if total else 0.0 for k, v in self.totals.items()}


class CommClock:
    """A DDP comm hook that all-reduces (mean) and records how long each all-reduce took."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s

    def hook(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        import torch.distributed as dist

        t0 = time.perf_counter()
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        fut = dist.all_reduce(tensor, async_op=True).get_future()

        def done(f: torch.futures.Future[Any]) -> torch.Tensor:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            value = f.value()
            return value[0] if isinstance(value, list) else value

        return fut.then(done)


def peak_rss_bytes() -> int:
    """This process's peak resident set size: VmHWM where Linux has it. ru_maxrss (the
    fallback; KiB) survives fork and exec, so a torchrun worker would report its larger
    agent's peak as its own."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def tensor_bytes(obj: Any) -> int:
    """Bytes held by tensors in a nested state (DTensor shards count their local part only)."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return int(local.numel() * local.element_size())
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state this rank holds (ZeRO: its shard's optimizer only)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps the local one
    return tensor_bytes(dict(inner.state))


def param_bytes(model: nn.Module) -> int:
    return sum(tensor_bytes(p) for p in model.parameters())


def count_params(model: nn.Module) -> int:
    return sum(int(p.numel()) for p in model.parameters())


def train_flops_per_sample(model: nn.Module, make_batch: Callable[[], tuple[torch.Tensor, ...]],
                           ) -> float:
    """Forward + backward FLOPs per sample on one batch, counted by torch's FlopCounterMode.

    Runs on the unwrapped module and clears the gradients it made, so training is unaffected.
    Embedding lookups count zero FLOPs in FlopCounterMode; the MLP's matmuls dominate.
    """
    from torch.utils.flop_counter import FlopCounterMode

    cat, num, y = make_batch()
    counter = FlopCounterMode(display=False)
    with counter:
        loss = nn.functional.cross_entropy(model(cat, num), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / max(1, int(y.shape[0]))


@dataclass(frozen=True, kw_only=True)
class Throughput:
    samples_per_s: float
    flops_per_s: float | None
    mfu: float | None
    samples_per_usd: float | None


def throughput(*, samples: int, seconds: float, flops_per_sample: float | None,
               peak_flops: float | None, world: int, price_per_hour: float | None) -> Throughput:
    """Run-level rates; MFU divides by the peak of all `world` processes together."""
    sps = samples / seconds if seconds > 0 else 0.0
    fps = sps * flops_per_sample if flops_per_sample else None
    mfu = fps / (peak_flops * world) if fps is not None and peak_flops else None
    per_usd = sps * 3600.0 / price_per_hour if price_per_hour else None
    return Throughput(samples_per_s=sps, flops_per_s=fps, mfu=mfu, samples_per_usd=per_usd)
