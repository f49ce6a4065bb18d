"""Latency, throughput, memory and cost of one model variant on one device.

Latency: one call per request, timed with perf_counter around the call (plus a device sync on
CUDA, where kernels are asynchronous), each call on different test rows so caches of one input
don't flatter the number; p50/p95 over the calls, after warm-up calls that are not counted.
Throughput: rows per second at the largest batch size measured. Cost per 1,000 predictions: the
device's price per hour times the time 1,000 predictions take at that throughput (on CPU the
price is per core-hour times the threads torch uses).

Peak memory: on CUDA, torch's allocator high-water mark during a batch (exact). On CPU there is
no per-model allocator counter, so it is the model's resident tensors plus an upper bound of the
activations of one batch (every module's output size summed, as if none were freed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.lab.core.decide import RECORDED_QUANTILES
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.machine import current_machine
from scalelab.lab.core.prices import DEFAULT as DEFAULT_PRICES
from scalelab.layers.nets.onnx import OnnxNet

Predictor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(kw_only=True)
class MeasureConfig:
    """How to time a variant and what its compute costs."""

    batch_sizes: list[int] = field(default_factory=lambda: [1, 32])
    """Batch sizes to time; throughput is taken at the largest."""
    calls: int = 200
    """Timed calls per batch size."""
    warmup: int = 20
    """Untimed calls first (allocations, lazy init, caches)."""
    rounds: int = 3
    """Timing rounds; the bench interleaves variants within a round and reports each one's
    median over rounds, so a burst of load on a shared machine hits one round of every variant
    rather than all rounds of one."""
    threads: int = 1
    """torch intra-op threads while timing. One, as in a serving worker (replicas, not threads,
    scale a tiny model; and on a shared machine a second thread that is not scheduled stalls
    every parallel region by milliseconds). Cost counts this many cores."""
    price_per_core_hour: float = DEFAULT_PRICES.core_hour_usd
    """USD per CPU core-hour (roughly an on-demand cloud vCPU)."""
    price_per_gpu_hour: float = DEFAULT_PRICES.gpu_hour_usd
    """USD per GPU-hour, used when the device is CUDA."""

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise BadUsageError("batch sizes must be >= 1")
        if self.calls < 1 or self.warmup < 0 or self.threads < 1 or self.rounds < 1:
            raise BadUsageError("calls, rounds and threads >= 1 and warmup >= 0 required")
        if self.price_per_core_hour < 0 or self.price_per_gpu_hour < 0:
            raise BadUsageError("prices must be >= 0")


@dataclass(frozen=True, kw_only=True)
class BatchTiming:
    batch_size: int
    p50_ms: float
    p95_ms: float
    rows_per_s: float
    samples_ms: tuple[float, ...] = ()
    """Every timed call's milliseconds (pooled over rounds by `median_of`): what latency
    quantiles with a sample size are read from; empty where the calls were not kept."""

    def quantiles(self) -> dict[float, float]:
        """Recorded quantiles (p50 … max) of the kept calls, each an order statistic (the
        ⌈q·n⌉-th smallest, as core.decide brackets them); empty without samples."""
        if not self.samples_ms:
            return {}
        ms = np.asarray(self.samples_ms)
        return {q: float(np.percentile(ms, q * 100, method="inverted_cdf"))
                for q in RECORDED_QUANTILES}


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one variant costs to run."""

    device: str
    """'cpu: <model>' or 'cuda: <name>'."""
    timings: list[BatchTiming]
    throughput_rows_per_s: float
    peak_memory_bytes: int
    model_bytes: int
    cost_per_1000_usd: float
    threads: int

    def at(self, batch_size: int) -> BatchTiming | None:
        return next((t for t in self.timings if t.batch_size == batch_size), None)


def resolve_device(name: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; 'cuda' without one is an error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise BadUsageError(
            "--device cuda: torch sees no CUDA device here; use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise BadUsageError(f"--device {name!r}: use auto, cpu or cuda")
    return name


def device_label(device: str) -> str:
    if device.startswith("cuda"):
        return f"cuda: {torch.cuda.get_device_name(torch.device(device))}"
    return current_machine().device


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def state_bytes(module: Any) -> int:
    """Bytes of the tensors a model keeps resident (int8 layers counted at their int8 size)."""
    if isinstance(module, OnnxNet):  # its weights live inside the graph bytes
        return module.nbytes()
    if hasattr(module, "int8_state"):
        return sum(t.numel() * t.element_size() for t in module.int8_state().values())
    if isinstance(module, nn.Module):
        seen: dict[int, int] = {}
        for t in module.state_dict().values():
            if isinstance(t, torch.Tensor) and not t.is_quantized:
                seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())
    return int(getattr(module, "model_bytes", 0))


def _activation_bytes(module: Any, c: torch.Tensor, x: torch.Tensor) -> int:
    if not isinstance(module, nn.Module):
        return 0
    total = [0]

    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            total[0] += out.numel() * out.element_size()

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        with torch.inference_mode():
            module(c, x)
    finally:
        for h in handles:
            h.remove()
    return total[0]


@torch.inference_mode()
def time_calls(model: Predictor, categorical: torch.Tensor, numeric: torch.Tensor, *,
               batch_size: int, calls: int, warmup: int, device: str) -> list[float]:
    """Milliseconds per call at `batch_size`, each call on the next rows (wrapping around)."""
    n = int(categorical.shape[0])
    if n < batch_size:
        raise BadUsageError(f"need at least {batch_size} test rows to time batch {batch_size}")
    starts = [(i * batch_size) % (n - batch_size + 1) for i in range(warmup + calls)]
    out = []
    for k, s in enumerate(starts):
        c, x = categorical[s:s + batch_size], numeric[s:s + batch_size]
        _sync(device)
        t0 = time.perf_counter()
        model(c, x)
        _sync(device)
        if k >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(model: Predictor, categorical: torch.Tensor, numeric: torch.Tensor,
            cfg: MeasureConfig, *, device: str) -> Measurement:
    """Time `model` at each batch size on `device` (inputs must already be there), with
    `cfg.threads` torch threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _measure(model, categorical, numeric, cfg, device=device)
    finally:
        torch.set_num_threads(before)


def _measure(model: Predictor, categorical: torch.Tensor, numeric: torch.Tensor,
             cfg: MeasureConfig, *, device: str) -> Measurement:
    timings = []
    for b in cfg.batch_sizes:
        ms = np.asarray(time_calls(model, categorical, numeric, batch_size=b, calls=cfg.calls,
                                   warmup=cfg.warmup, device=device))
        timings.append(BatchTiming(batch_size=b, p50_ms=float(np.percentile(ms, 50)),
                              p95_ms=float(np.percentile(ms, 95)),
                              rows_per_s=b * 1e3 / float(ms.mean()),
                              samples_ms=tuple(float(v) for v in ms)))
    top = max(timings, key=lambda t: t.batch_size)
    bmax = top.batch_size
    model_bytes = state_bytes(model)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            model(categorical[:bmax], numeric[:bmax])
        torch.cuda.synchronize()
        peak = int(torch.cuda.max_memory_allocated())
        per_hour = cfg.price_per_gpu_hour
        threads = 1
    else:
        peak = model_bytes + _activation_bytes(model, categorical[:bmax], numeric[:bmax])
        threads = torch.get_num_threads()
        per_hour = cfg.price_per_core_hour * threads
    cost = per_hour * (1000.0 / top.rows_per_s) / 3600.0 if top.rows_per_s > 0 else 0.0
    return Measurement(device=device_label(device), timings=timings,
                       throughput_rows_per_s=top.rows_per_s, peak_memory_bytes=peak,
                       model_bytes=model_bytes, cost_per_1000_usd=cost, threads=threads)


def median_of(runs: list[Measurement]) -> Measurement:
    """One measurement from several rounds: the median of each timing figure.

    Cost is inversely proportional to throughput at a fixed price, so it is rescaled from the
    first round's by the ratio of throughputs (exact, no price needed here).
    """
    if not runs:
        raise BadUsageError("median_of needs at least one measurement")
    first = runs[0]
    timings = []
    for t in first.timings:
        ts = [r.at(t.batch_size) or t for r in runs]
        timings.append(BatchTiming(batch_size=t.batch_size,
                              p50_ms=float(np.median([x.p50_ms for x in ts])),
                              p95_ms=float(np.median([x.p95_ms for x in ts])),
                              rows_per_s=float(np.median([x.rows_per_s for x in ts])),
                              samples_ms=tuple(v for x in ts for v in x.samples_ms)))
    top = max(timings, key=lambda t: t.batch_size)
    cost = (first.cost_per_1000_usd * first.throughput_rows_per_s / top.rows_per_s
            if top.rows_per_s > 0 else first.cost_per_1000_usd)
    return Measurement(device=first.device, timings=timings,
                       throughput_rows_per_s=top.rows_per_s,
                       peak_memory_bytes=max(r.peak_memory_bytes for r in runs),
                       model_bytes=first.model_bytes, cost_per_1000_usd=cost,
                       threads=first.threads)
