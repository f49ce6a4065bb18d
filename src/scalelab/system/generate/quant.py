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
slower than oneDNN's fp32 GEMM at these shapes; docs/generate.md has the measurement), so a
quantized linear rounds its input, its scales and its output to bf16: the codes are the file's,
the arithmetic is not fp32. The quality gate (scalelab.system.generate.quality) measures what
that costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.lab.core.errors import BadUsageError

WEIGHTS = ("fp32", "int8", "q4")
GROUP = 32
"""Weights per GGUF block, and the int4 kernel's group size."""
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0")
"""GGUF tensor types `q4` runs as blocks; any other type is dequantized to fp32."""
_ROWS = 16  # the int4 packer wants the output dimension a multiple of this


def check_weights(weights: str) -> str:
    if weights not in WEIGHTS:
        raise BadUsageError(f"--weights {weights!r} is not one of: {', '.join(WEIGHTS)}")
    return weights


@dataclass
class Blocks:
    """A (rows, cols) weight as GGUF-style blocks of 32 along cols: w = d * code + m."""

    codes: torch.Tensor
    """(rows, cols) int16: 0..15 for 4-bit types, -128..127 for Q8_0."""
    d: torch.Tensor
    """(rows, cols / 32) fp32 block scales (fp16 values in a GGUF file)."""
    m: torch.Tensor
    """(rows, cols / 32) fp32 block offsets (0 for Q8_0)."""
    bits: int
    qtype: str

    def dequantize(self) -> torch.Tensor:
        r, c = self.codes.shape
        g = self.codes.view(r, c // GROUP, GROUP).float()
        return (g * self.d[..., None] + self.m[..., None]).view(r, c)

    def rows(self, index: torch.Tensor) -> Blocks:
        """The blocks of some rows (a RoPE row permutation, a padding)."""
        return Blocks(self.codes[index], self.d[index], self.m[index], self.bits, self.qtype)


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


def _int4_part(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype
) -> tuple[Any, Any]:
    """One int4 operand: packed codes (q in 0..15, (N, K)) and (K/32, N, 2) scale/zero."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 2)
    sz = torch.stack([scale.T, zero.T], dim=-1).to(dtype).contiguous()
    return packed, sz


class Int4Linear(nn.Module):
    """A bias-free linear over GGUF blocks, run by `aten._weight_int4pack_mm_for_cpu`.

    dtype: what activations, scales and outputs are computed in. bf16 is the kernel's fast
    path (the engine's); float32 is its exact path (the tests' check of the block mapping).
    """

    packed0: torch.Tensor
    scale_zero0: torch.Tensor
    packed1: torch.Tensor
    scale_zero1: torch.Tensor

    def __init__(self, blocks: Blocks, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.dtype = dtype
        n, k = blocks.codes.shape
        self.in_features, self.out_features, self.qtype = k, n, blocks.qtype
        pad = -n % _ROWS
        if pad:  # zero rows (code 0, scale 0, offset 0), cut off the output again
            idx = torch.cat([torch.arange(n), torch.zeros(pad, dtype=torch.long)])
            blocks = blocks.rows(idx)
            blocks.d[n:] = 0
            blocks.m[n:] = 0
        if blocks.bits == 4:
            parts = [_int4_part(blocks.codes, blocks.d, blocks.m + 8 * blocks.d, dtype)]
        else:
            # code = 16 * hi + lo with hi in -8..7 and lo in 0..15: two exact int4 operands.
            hi, lo = blocks.codes >> 4, blocks.codes & 0x0F
            parts = [
                _int4_part(hi + 8, 16 * blocks.d, blocks.m, dtype),
                _int4_part(lo, blocks.d, 8 * blocks.d, dtype),
            ]
        for i, (p, sz) in enumerate(parts):
            self.register_buffer(f"packed{i}", p)
            self.register_buffer(f"scale_zero{i}", sz)
        self.num_parts = len(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.dtype)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed0, GROUP, self.scale_zero0)
        if self.num_parts == 2:
            out = out.float() + torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2, self.packed1, GROUP, self.scale_zero1
            ).float()
        return out[:, : self.out_features].float().reshape(*shape[:-1], self.out_features)


class Int8Linear(nn.Module):
    """A bias-free linear with per-output-channel symmetric int8 weights
    (`aten._weight_int8pack_mm`); dtype as in `Int4Linear`."""

    codes: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.dtype = dtype
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        # The scale the kernel will use (bf16) is the one the codes are rounded against.
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(dtype)
        codes = torch.round(w / scale.float()[:, None]).clamp(-128, 127).to(torch.int8)
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scales", scale)

    def dequantize(self) -> torch.Tensor:
        return self.codes.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.dtype)
        out = torch.ops.aten._weight_int8pack_mm(x2, self.codes, self.scales)
        return out.float().reshape(*shape[:-1], self.out_features)


class BlockEmbedding(nn.Module):
    """Token embedding over GGUF blocks: only the looked-up rows are expanded (exactly: an
    int8 or 4-bit code times an fp16 scale is exact in fp32)."""

    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    def __init__(self, blocks: Blocks) -> None:
        super().__init__()
        self.register_buffer("codes", blocks.codes.to(torch.int8))
        self.register_buffer("d", blocks.d.contiguous())
        self.register_buffer("m", blocks.m.contiguous())
        self.embedding_dim = blocks.codes.shape[1]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        c = self.codes[ids].float().unflatten(-1, (-1, GROUP))
        return (c * self.d[ids][..., None] + self.m[ids][..., None]).flatten(-2)


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


def weight_bytes(model: nn.Module) -> int:
    """Bytes the weights take as they run: parameters and quantized buffers (each shared
    tensor once), oneDNN-packed copies included, RoPE tables excluded."""
    from scalelab.system.generate.forward import FusedInt4
    from scalelab.system.generate.runner import PackedLinear

    seen: set[int] = set()
    total = 0
    for name, mod in model.named_modules():
        if "rotary" in name:
            continue
        tensors = list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False))
        if isinstance(mod, FusedInt4):  # its rows are its parts' weights, counted there
            tensors = [mod.scale_zero]
        for t in tensors:
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        if isinstance(mod, PackedLinear):
            total += mod.in_features * mod.out_features * 4
    return total
