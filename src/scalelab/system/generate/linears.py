"""Every linear-layer format the engine runs, and what each costs in bytes.

- `Int4Linear`: a bias-free linear over GGUF blocks (Q4_0/Q4_1, and Q8_0 as two 4-bit halves),
  run by torch's CPU int4 kernel; `FusedInt4`: several of them over one input as one call.
- `Int8Linear`: per-output-channel symmetric int8 weights, torch's int8 weight-only kernel.
- `PackedLinear`: fp32 weights in oneDNN's blocked layout.
- `BlockEmbedding`: the token embedding over GGUF blocks (rows expanded on lookup).

`weight_bytes` counts a model's weights as they run, whichever of these it holds. How a model
comes to hold them is elsewhere: generate.quant converts (int8, q4 from a GGUF file),
generate.runner packs (`pack_linears`), generate.forward fuses (`fuse_projections`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

GROUP = 32
"""Weights per GGUF block, and the int4 kernel's group size."""
_ROWS = 16  # the int4 packer wants the output dimension a multiple of this
INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default
PACK_BLOCK = 64
"""Rows torch's CPU int4 packer interleaves as one block: a concatenation of packed operands is
the packing of the concatenation only when every part is a whole number of these (measured:
parts of 16, 32 or 48 rows are not; SmolLM2's 576 / 192 / 1536 are)."""


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


class FusedInt4(nn.Module):
    """Int4Linears over one input run as one `_weight_int4pack_mm_for_cpu` call.

    Built in place: each part's `packed0` becomes a view of the fused operand's rows (the int4
    packer packs row by row, so the rows of a concatenation are the concatenation of the
    rows), so the parts still run alone and nothing is stored twice but the small scales.
    """

    packed: torch.Tensor
    scale_zero: torch.Tensor

    def __init__(self, parts: list[Int4Linear]) -> None:
        super().__init__()
        self.dtype = parts[0].dtype
        self.sizes = [p.out_features for p in parts]
        # Not persistent: the parts' own buffers stay what the state dict holds.
        self.register_buffer("packed", torch.cat([p.packed0 for p in parts]), persistent=False)
        self.register_buffer(
            "scale_zero",
            torch.cat([p.scale_zero0 for p in parts], dim=1).contiguous(),
            persistent=False,
        )
        offset = 0
        for p, n in zip(parts, self.sizes, strict=True):
            p.packed0 = self.packed[offset : offset + n]
            offset += n

    @staticmethod
    def fusable(parts: list[nn.Module]) -> bool:
        """Single-operand int4 linears of one input width and dtype, no padding rows, each a
        whole number of the packer's row blocks."""
        if not all(type(p) is Int4Linear for p in parts):
            return False
        lins = [p for p in parts if isinstance(p, Int4Linear)]
        return all(
            p.num_parts == 1
            and p.dtype == lins[0].dtype
            and p.in_features == lins[0].in_features
            and p.packed0.shape[0] == p.out_features
            and p.out_features % PACK_BLOCK == 0
            for p in lins
        )

    def forward(self, x2: torch.Tensor) -> torch.Tensor:
        """x2: (rows, in) already in the kernel's dtype -> (rows, sum of the parts' outs) in
        fp32, the parts' outputs side by side: column block i is what part i's call gives."""
        return INT4_MM(x2, self.packed, GROUP, self.scale_zero).float()


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


class PackedLinear(nn.Module):
    """An inference-only `nn.Linear` (no bias) whose weight lives in oneDNN's blocked layout.

    A decode step multiplies a few rows by every weight matrix; MKL's general GEMM reads the
    plain (out, in) layout poorly at those shapes. The blocked copy, made once, computes the
    same product (fp32, a different summation order: logits agree to ~1e-4) in 0.57-0.72x the
    time at 8 rows, 0.85-0.94x at 1 row and 0.85x at 512 (a prefill chunk) on the two-core
    machine; a whole SmolLM2 decode step at 8 sequences in 0.69x (docs/generate-weights.md). The
    state dict still holds the plain weight (converted back exactly), so a packed model saves
    and compares like the original.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    @property
    def weight(self) -> torch.Tensor:
        """The plain (out, in) weight, converted back (a copy)."""
        return self.packed.to_dense()

    def _save_to_state_dict(
        self, destination: dict[str, torch.Tensor], prefix: str, keep_vars: bool
    ) -> None:
        destination[prefix + "weight"] = self.weight

    def __deepcopy__(self, memo: dict[int, object]) -> PackedLinear:
        # oneDNN tensors have no storage to copy; rebuild from the plain weight.
        plain = nn.Linear(self.in_features, self.out_features, bias=False)
        with torch.no_grad():
            plain.weight.copy_(self.weight)
        return PackedLinear(plain)


def weight_bytes(model: nn.Module) -> int:
    """Bytes the weights take as they run: parameters and quantized buffers (each shared
    tensor once), oneDNN-packed copies included, RoPE tables excluded."""
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
