"""Quantized weights for the engine: the GGUF's own 4/8-bit blocks, and int8 from fp32.

Two settings besides fp32 (`WEIGHTS`):

- `q4` runs the file's Q4_0/Q4_1/Q8_0 blocks without expanding them to fp32. Each block of 32
  weights is `d * code + m` (Q4_1: code 0..15 and a min m; Q4_0: code 0..15 and m = -8d;
  Q8_0: code -128..127, m = 0). torch's group-wise int4 matmul computes
  `(q - 8) * scale + zero` per group of 32, so a 4-bit block maps onto it exactly with
  scale = d and zero = m + 8d; an 8-bit block is split into two 4-bit halves
  (code = 16 * hi + lo) run as two int4 products and summed. Tensors the file holds at other
  precisions (F32 norms, K-quants, ...) stay as they are.
- `int8` quantizes fp32 weights per output channel, symmetric (scale = max|w| / 127), and runs
  torch's int8 weight-only matmul.

Both kernels are fast on CPU only with bf16 activations (their fp32 paths are scalar, 20-30x
slower than oneDNN's fp32 GEMM at these shapes; docs/generate-weights.md has the measurement), so a
quantized linear rounds its input, its scales and its output to bf16: the codes are the file's,
the arithmetic is not fp32. The quality gate (scalelab.system.generate.quality) measures what
that costs.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.generate.linears import (
    GROUP,
    BlockEmbedding,
    Blocks,
    Int4Linear,
    Int8Linear,
)

WEIGHTS = ("fp32", "int8", "q4")
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0")
"""GGUF tensor types `q4` runs as blocks; any other type is dequantized to fp32."""


def check_weights(weights: str) -> str:
    if weights not in WEIGHTS:
        raise BadUsageError(f"--weights {weights!r} is not one of: {', '.join(WEIGHTS)}")
    return weights


def blocks_from_gguf(data: np.ndarray, qtype: str) -> Blocks:
    """Decode raw GGUF rows ((rows, bytes) uint8) of Q4_0, Q4_1 or Q8_0 into `Blocks`.

    Layouts (ggml-common.h): Q4_0 = fp16 d, 16 bytes of nibbles; Q4_1 = fp16 d, fp16 m, 16
    bytes; Q8_0 = fp16 d, 32 int8. Nibble j's low half is element j, its high half j + 16.
    """
    rows = data.shape[0]
    head = {"Q4_0": 2, "Q4_1": 4, "Q8_0": 2}[qtype]
    size = head + (GROUP if qtype == "Q8_0" else GROUP // 2)
    b = np.ascontiguousarray(data).reshape(rows, -1, size)
    nb = b.shape[1]
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == "Q8_0":
        codes = b[..., 2:].copy().view(np.int8).astype(np.int16)
        m = np.zeros_like(d)
        bits = 8
    else:
        qs = b[..., head:]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int16)
        m = (b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if qtype == "Q4_1"
             else -8.0 * d)
        bits = 4
    return Blocks(
        torch.from_numpy(codes.reshape(rows, nb * GROUP)),
        torch.from_numpy(np.ascontiguousarray(d)),
        torch.from_numpy(np.ascontiguousarray(m)),
        bits,
        qtype,
    )


def quantize_blocks(w: torch.Tensor, qtype: str) -> Blocks:
    """Quantize an fp32 (rows, cols) weight the way llama.cpp's converter does (gguf.quants)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    raw = quantize(w.detach().float().numpy(), GGMLQuantizationType[qtype])
    return blocks_from_gguf(raw, qtype)


def quantize_int8(model: nn.Module) -> int:
    """Replace every bias-free `nn.Linear` by an `Int8Linear`, in place; the number replaced.
    A tied output layer gets its own int8 copy; the embedding keeps the fp32 table."""
    n = 0
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if type(child) is nn.Linear and child.bias is None:
                setattr(mod, name, Int8Linear(child.weight))
                n += 1
    return n


def install_blocks(model: nn.Module, blocks: dict[str, Blocks]) -> None:
    """Put `Int4Linear`s (and a `BlockEmbedding`) where `blocks` names weights
    ("model.layers.0.mlp.up_proj.weight", "lm_head.weight", "model.embed_tokens.weight")."""
    for key, b in blocks.items():
        path = key.removesuffix(".weight").split(".")
        parent = model.get_submodule(".".join(path[:-1]))
        new: nn.Module = BlockEmbedding(b) if path[-1] == "embed_tokens" else Int4Linear(b)
        setattr(parent, path[-1], new)


def quantize_q4(model: nn.Module, embedding: str = "Q8_0", linear: str = "Q4_1") -> None:
    """The tiny model in SmolLM2's file layout: linears Q4_1, embedding/output Q8_0 (through
    gguf.quants, as llama.cpp's converter writes them), then `install_blocks`."""
    blocks: dict[str, Blocks] = {}
    for name, mod in model.named_modules():
        if type(mod) is nn.Linear:
            qt = embedding if name == "lm_head" else linear
            blocks[f"{name}.weight"] = quantize_blocks(mod.weight, qt)
        elif isinstance(mod, nn.Embedding):
            blocks[f"{name}.weight"] = quantize_blocks(mod.weight, embedding)
    install_blocks(model, blocks)


def release_freed_memory() -> None:
    """Hand the heap pages freed by a conversion back to the OS: glibc keeps them otherwise
    (SmolLM2 q4: RSS 701 -> 452 MB right after loading, int8: 1032 -> 555 MB). A no-op
    where there is no glibc."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


