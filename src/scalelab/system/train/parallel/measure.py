"""What a transformer step costs on one rank: bytes held, activations saved, time per kind of
communication, bytes moved.

Communication is read from torch.profiler over a few steps: every collective or point-to-point
op shows up twice, once as the c10d op the model issued (`c10d::_reduce_scatter_base_`, which
says what was meant) and once as the gloo op that did the work on gloo's thread (`gloo:all_reduce`
— gloo runs a reduce-scatter as an all-reduce —, with the tensor's shape, dtype and the time it
took, peers' waiting included). The two are paired in issue order: the kind comes from the c10d
op, the time from the gloo op, the bytes from the larger of the two's tensors (the full tensor of
an all-gather or reduce-scatter, not the shard). Effective bandwidth is bytes / time per kind
(nccl-tests' "algorithm bandwidth"). Compute is the step's wall time minus its communication
time; where communication overlaps compute (FSDP prefetches the next block's all-gather) the
split charges the overlap to communication.

Activations are the bytes autograd saves for backward, counted by a saved-tensor hook: each
storage once, parameters excluded, released when the graph that saved it is freed; the peak of
what is live is what the memory planner predicts.
"""

from __future__ import annotations

import ctypes
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "p2p", "broadcast", "other")
_C10D_KIND = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "_allgather_base": "all_gather", "allgather": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "send": "p2p", "recv": "p2p", "recv_any_source": "p2p",
    "broadcast": "broadcast",
}
_GLOO_KIND = {"all_reduce": "all_reduce", "all_gather": "all_gather", "send": "p2p",
              "recv": "p2p", "broadcast": "broadcast", "reduce_scatter": "reduce_scatter"}
_DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
                "int": 4, "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2}


def kind_of_c10d(name: str) -> str:
    """'c10d::_reduce_scatter_base_' -> 'reduce_scatter'."""
    op = name.removeprefix("c10d::").rstrip("_")
    return _C10D_KIND.get(op, _C10D_KIND.get(op + "_", "other"))


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@dataclass(kw_only=True)
class CommStats:
    """Per kind of communication: calls, seconds and bytes over the profiled steps."""

    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def per_step(self, steps: int) -> dict[str, Any]:
        s = max(1, steps)
        return {k: {"calls": self.calls[k] / s, "ms": 1e3 * self.seconds[k] / s,
                    "bytes": self.bytes[k] / s,
                    "bandwidth_bytes_per_s": (self.bytes[k] / self.seconds[k]
                                              if self.seconds[k] > 0 else None)}
                for k in KINDS if self.calls[k]}


def comm_from_events(events: list[tuple[str, float, float, list[Any], list[str]]]) -> CommStats:
    """CommStats from (name, start_s, duration_s, shapes, dtypes) profiler events.

    A pure function of the event list, so the pairing rule is tested without a profiler.
    """
    stats = CommStats()
    pending: deque[tuple[str, int]] = deque()
    for name, _start, dur, shapes, dtypes in sorted(events, key=lambda e: e[1]):
        if name.startswith("c10d::"):
            kind = kind_of_c10d(name)
            if kind in ("other",) and "barrier" in name:
                continue
            numel = max((_numel(s) for s in shapes if isinstance(s, list | tuple) and s),
                        default=0)
            pending.append((kind, numel))
        elif name.startswith("gloo:") or name.startswith("nccl:"):
            op = name.split(":", 1)[1]
            numel = max((_numel(s) for s in shapes if isinstance(s, list | tuple) and s),
                        default=0)
            size = next((_DTYPE_BYTES[d] for d in dtypes if d in _DTYPE_BYTES), 4)
            kind = _GLOO_KIND.get(op, "other")
            if pending:
                kind, c10d_numel = pending.popleft()
                numel = max(numel, c10d_numel)
            stats.calls[kind] += 1
            stats.seconds[kind] += dur
            stats.bytes[kind] += numel * size
    return stats


def profiler_events(prof: Any) -> list[tuple[str, float, float, list[Any], list[str]]]:
    """The c10d and gloo events of a finished torch.profiler.profile."""
    out = []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name.startswith(("c10d::", "gloo:", "nccl:")):
            out.append((name, e.start_ns() / 1e9, e.duration_ns() / 1e9, list(e.shapes()),
                        list(e.dtypes())))
    return out


def rss_status() -> dict[str, int]:
    """This process's resident set now (VmRSS) and its high-water mark (VmHWM), in bytes.

    ru_maxrss is the same high-water mark; /proc/self/status has both, so a timeline of the
    two says which phase of a run set the peak. Empty off Linux.
    """
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out["rss" if key == "VmRSS" else "hwm"] = int(value.split()[0]) * 1024
    except OSError:
        pass
    free = allocator_free_bytes()
    if free is not None:
        out["malloc_free"] = free
    return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]


def allocator_free_bytes() -> int | None:
    """Bytes glibc's malloc holds free (freed by the program, kept by the allocator: counted in
    RSS wherever they were touched), from mallinfo2 (glibc >= 2.33); None elsewhere.

    torch's CPU allocator is malloc, so this is the part of a peak RSS that is neither runtime
    nor live tensors: what the planner leaves out."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    info = fn()
    return int(info.fordblks + info.fsmblks)


def local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size())


def param_bytes(module: nn.Module) -> int:
    return sum(local_bytes(p) for p in module.parameters())


def grad_bytes(module: nn.Module) -> int:
    return sum(local_bytes(p.grad) for p in module.parameters() if p.grad is not None)


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for state in optimizer.state.values():
        for v in state.values():
            # AdamW's `step` counter is a 0-d tensor: 8 bytes per parameter tensor, not per
            # element, and left out of the per-element formula; count the moment tensors only.
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                total += local_bytes(v)
    return total


class ActivationMeter:
    """Bytes autograd holds for backward: live now and the peak since `reset`."""

    def __init__(self, module: nn.Module) -> None:
        self._params = {self._key(p) for p in module.parameters()}
        self._refs: dict[int, int] = {}
        self._size: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    @staticmethod
    def _plain(t: torch.Tensor) -> torch.Tensor:
        """The plain tensor under a DTensor or a functional collective's AsyncCollectiveTensor
        (what TP layers hand on), whose own storage is not a real one."""
        for _ in range(4):
            if hasattr(t, "_local_tensor"):
                t = t._local_tensor
            elif type(t).__name__ == "AsyncCollectiveTensor":
                t = t.elem  # type: ignore[attr-defined]
            else:
                break
        return t

    @classmethod
    def _key(cls, t: torch.Tensor) -> int:
        return int(cls._plain(t).untyped_storage().data_ptr())

    def reset(self) -> None:
        self.peak = self.live

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.live -= self._size.pop(key)
            del self._refs[key]

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        local = self._plain(t)
        if local.device.type == "meta":
            return t
        key = self._key(t)
        base = t._base if t._base is not None else t
        # FSDP all-gathers parameters into fresh storage before each block runs: those are
        # nn.Parameters (or views of one), not activations.
        if key in self._params or key == 0 or isinstance(base, nn.Parameter):
            return t
        if key not in self._refs:
            self._refs[key] = 0
            self._size[key] = int(local.untyped_storage().nbytes())
            self.live += self._size[key]
            self.peak = max(self.peak, self.live)
        self._refs[key] += 1
        weakref.finalize(t, self._release, key)
        return t

    @contextmanager
    def track(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield
