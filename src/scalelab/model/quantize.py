"""Dynamic int8 quantization of a model variant.

The technique itself (which int8 path, which layers) is chosen in one function,
`scalelab.nets.variants.quantize_int8`, because the server must rebuild the same int8 model from
disk with nothing but scalelab.nets; this module wraps a model in it and names the resulting
architecture. Measured on this machine (docs/model.md): for the flights MLP at batch 1,
int8 is *slower* than fp32 — a 64-wide Linear is a few microseconds of arithmetic, and dynamic
quantization adds per-call work (choose the activation scale, quantize, dequantize) that costs
more than the int8 GEMM saves. int8 pays off for wide layers and large batches (MiniLM).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scalelab.nets.variants import Int8Module, quantize_int8

ARCH = "int8_dynamic"

__all__ = ["ARCH", "int8_variant", "quantize_int8"]


def int8_variant(module: nn.Module, arch: str,
                 params: dict[str, Any]) -> tuple[Int8Module, str, dict[str, Any]]:
    """(int8 module, its architecture name, its model.json params) for a registered base."""
    return Int8Module(module), ARCH, {"base": arch, "base_params": params}
