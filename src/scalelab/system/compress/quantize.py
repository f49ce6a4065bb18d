"""Dynamic int8 quantization of a model variant, on the fastest int8 path measured here.

Two int8 paths exist for the flights models on CPU, and which one is faster depends on the model
and the machine, so `choose_int8` times both at batch 1 on the caller's rows and keeps the faster
(the issue's "measure and pick"; every candidate's timing is kept for the report):

- ``torch``: torch.ao's quantize_dynamic over the Linear layers (`nets.variants.quantize_int8`,
  the one place that path is built, because the server must rebuild the same int8 model from
  safetensors with nothing but
  scalelab.layers.nets). Measured here (docs/model.md): *slower* than fp32
  at batch 1 on the 64x64 flights MLP — a 64-wide Linear is a few microseconds of arithmetic, and
  dynamic quantization adds per-call work (activation scale, quantize, dequantize) that costs
  more than the int8 GEMM saves. It pays off for wide layers and large batches (MiniLM).
- ``onnxruntime``: the model exported to ONNX and quantized by ONNX Runtime (MatMulInteger),
  published as an ``onnx`` version (nets.onnx). Faster than torch fp32 at batch 1 here, but
  mostly because ONNX Runtime dispatches a small graph with less overhead than eager torch: the
  bench's ``onnx`` (fp32) row shows how much of the gain is the runtime rather than int8.
  Needs onnx + onnxruntime; without them only the torch path is a candidate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scalelab.layers.nets import onnx
from scalelab.layers.nets.variants import Int8Module, quantize_int8
from scalelab.system.compress import ort
from scalelab.system.compress.measure import time_calls

ARCH = "int8_dynamic"

__all__ = ["ARCH", "Int8Choice", "choose_int8", "int8_variant", "quantize_int8"]


def int8_variant(module: nn.Module, arch: str,
                 params: dict[str, Any]) -> tuple[Int8Module, str, dict[str, Any]]:
    """(torch int8 module, its architecture name, its model.json params) for a registered base."""
    return Int8Module(module), ARCH, {"base": arch, "base_params": params}


@dataclass(frozen=True, kw_only=True)
class Int8Choice:
    """The int8 model kept, how to publish it, and what every candidate measured."""

    backend: str
    model: nn.Module
    arch: str
    params: dict[str, Any]
    p50_ms_batch1: dict[str, float]
    """Median latency at batch 1 per candidate backend."""


def choose_int8(module: nn.Module, arch: str, params: dict[str, Any], *, workdir: Path,
                categorical: torch.Tensor, numeric: torch.Tensor, calls: int = 200,
                threads: int = 1) -> Int8Choice:
    """Build every available int8 path of a CPU model and keep the fastest at batch 1."""
    q, qarch, qparams = int8_variant(module, arch, params)
    candidates: dict[str, tuple[nn.Module, str, dict[str, Any]]] = {"torch": (q, qarch, qparams)}
    if ort.available():
        net = ort.tabular(module, workdir / "int8-candidate", int8=True,
                          n_categorical=int(categorical.shape[1]),
                          n_numeric=int(numeric.shape[1]), threads=threads)
        candidates["onnxruntime"] = (net, onnx.ARCH, {"exported_from": arch, "int8": True,
                                                      "quantization": "onnxruntime dynamic"})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        p50 = {name: statistics.median(time_calls(m, categorical, numeric, batch_size=1,
                                                  calls=calls, warmup=20, device="cpu"))
               for name, (m, _, _) in candidates.items()}
    finally:
        torch.set_num_threads(before)
    best = min(p50, key=lambda k: p50[k])
    model, best_arch, best_params = candidates[best]
    return Int8Choice(backend=best, model=model, arch=best_arch, params=best_params,
                      p50_ms_batch1=p50)
