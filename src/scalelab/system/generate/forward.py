"""The engine's forward pass: the Llama stack run as one flat function, projections fused.

`LlamaForCausalLM.forward` goes through ~8 `nn.Module` calls and ~60 small tensor ops per layer.
At one decode stream the matrix products are a small share of a step (SmolLM2 q4, 1 thread:
the int4 kernels ~36% of the step's time under cProfile; module dispatch, dtype conversions,
RoPE and the paged-attention bookkeeping the rest), so every Python-level step counts.
`StepForward` runs the same arithmetic, op for op, without the module calls:

- q/k/v, and gate/up, read the same input. Where they are `Int4Linear`s their packed rows are
  concatenated into one operand (`FusedInt4`) and run as one product: 4 int4 calls per layer
  instead of 7. The kernel computes each output column from its own row of codes, so the fused
  product is bit-identical to the separate ones (tests/system/generate/test_forward.py); the
  separate modules keep views of the fused rows, so the weights are stored once.
- RoPE's cos/sin are shaped once per step, not once per layer and tensor.
- Fewer ops around the products (1,296 torch ops a one-stream step instead of 2,199): RMSNorm
  as `F.rms_norm`, RoPE by `roll` with its sign folded into sin once a step, the products'
  bf16 outputs added into the fp32 residual without a cast, `silu(g) * u` written straight
  into the down product's bf16 operand, the residual kept as (rows, width).

The logits are bit-identical to `model(...)` (same ops, same order, same dtypes), so greedy
output is unchanged; the module forward stays the reference (training, perplexity, tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.layers.nets.llama import AttentionBackend, DecoderLayer, LlamaForCausalLM
from scalelab.system.generate.linears import GROUP, INT4_MM, FusedInt4, Int4Linear

Linear = Callable[[torch.Tensor], torch.Tensor]


def fuse_projections(model: LlamaForCausalLM) -> int:
    """Give each layer `self_attn.qkv` and `mlp.gate_up` (`FusedInt4`) where its projections
    are fusable; the number of fused modules made (0 when already fused or not int4)."""
    n = 0
    for layer in model.model.layers:
        attn, mlp = cast(DecoderLayer, layer).self_attn, cast(DecoderLayer, layer).mlp
        qkv: list[nn.Module] = [attn.q_proj, attn.k_proj, attn.v_proj]
        if not hasattr(attn, "qkv") and FusedInt4.fusable(qkv):
            attn.qkv = FusedInt4(cast(list[Int4Linear], qkv))
            n += 1
        gate_up: list[nn.Module] = [mlp.gate_proj, mlp.up_proj]
        if not hasattr(mlp, "gate_up") and FusedInt4.fusable(gate_up):
            mlp.gate_up = FusedInt4(cast(list[Int4Linear], gate_up))
            n += 1
    return n


def _operand(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.dtype] | None:
    """(packed codes, scales, dtype) of a one-operand unpadded `Int4Linear`: what the flat
    forward calls the kernel on itself, taking its output in the kernel's dtype."""
    if type(mod) is Int4Linear and mod.num_parts == 1 and mod.packed0.shape[0] == mod.out_features:
        return mod.packed0, mod.scale_zero0, mod.dtype
    return None


def _linear(mod: nn.Module) -> Linear:
    """The module's forward itself (no `__call__` hooks to walk); a plain `nn.Linear` as
    F.linear, and an unpadded `Int4Linear` as its kernel calls, which is what their forwards
    compute (a two-operand one adds the second product into the first's fp32 copy in place:
    the same sum, one op fewer)."""
    if type(mod) is nn.Linear:
        w, b = mod.weight, mod.bias
        return lambda x: F.linear(x, w, b)
    if type(mod) is Int4Linear and mod.packed0.shape[0] == mod.out_features:
        lin = mod

        def int4(x: torch.Tensor) -> torch.Tensor:
            x2 = x.reshape(-1, x.shape[-1]).to(lin.dtype)
            out = INT4_MM(x2, lin.packed0, GROUP, lin.scale_zero0).float()
            if lin.num_parts == 2:
                out += INT4_MM(x2, lin.packed1, GROUP, lin.scale_zero1)
            return out.view(*x.shape[:-1], lin.out_features)

        return int4
    return cast(Linear, mod.forward)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`apply_rope`'s x * cos + cat(-x2, x1) * sin with the sign folded into sin once a step:
    cat(-x2, x1) * sin == roll(x, half) * cat(-sin1, sin2) exactly (negation is exact), in 4
    ops instead of 7. A bf16 x (the fused int4 product's raw output) is promoted to fp32 inside
    the products, exactly as its fp32 copy would be."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


class _Layer:
    """One decoder layer's tensors and callables, looked up once."""

    def __init__(self, layer: DecoderLayer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
        self.index = attn.layer
        self.ln1, self.eps1 = ln1.weight, ln1.eps
        self.ln2, self.eps2 = ln2.weight, ln2.eps
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        # q, k then v in one operand (FusedInt4 over [q_proj, k_proj, v_proj]).
        self.qkv: FusedInt4 | None = getattr(attn, "qkv", None)
        self.gate_up: FusedInt4 | None = getattr(mlp, "gate_up", None)
        self.qk_v = ((self.heads + self.kv_heads) * self.head_dim, self.kv_heads * self.head_dim)
        self.q, self.k, self.v = _linear(attn.q_proj), _linear(attn.k_proj), _linear(attn.v_proj)
        self.o, self.o_raw = _linear(attn.o_proj), _operand(attn.o_proj)
        self.gate, self.up = _linear(mlp.gate_proj), _linear(mlp.up_proj)
        self.down, self.down_raw = _linear(mlp.down_proj), _operand(mlp.down_proj)
        if self.gate_up is None or (self.down_raw and self.down_raw[2] != self.gate_up.dtype):
            self.down_raw = None  # silu(g) * u is written in the down kernel's dtype


class StepForward:
    """`model(ids, positions, attention, logits_at=...)` for the engine, bit for bit, in
    fewer calls. Built once per runner; rebuild it if the model's modules are replaced."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        fuse_projections(model)
        m = model.model
        self.embed = _linear(m.embed_tokens) if type(m.embed_tokens) is not nn.Embedding else (
            lambda ids, e=m.embed_tokens: F.embedding(ids, e.weight)
        )
        self.rotary = m.rotary
        self.layers = [_Layer(cast(DecoderLayer, layer)) for layer in m.layers]
        self.norm, self.eps = m.norm.weight, m.norm.eps
        self.head = _linear(model.lm_head)

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend,
        logits_at: torch.Tensor,
    ) -> torch.Tensor:
        cos, sin = self.rotary(positions)
        x = self.embed(input_ids)
        b, t, width = x.shape
        # The residual stream as (rows, width): the products take and give rows, so only the
        # attention's operands are shaped (b, t, heads, head_dim).
        x = x.view(b * t, width)
        norm_shape = (width,)
        cos = cos.unsqueeze(2).to(x.dtype)
        half = cos.shape[-1] // 2
        sin = sin.unsqueeze(2).to(x.dtype)
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        act: torch.Tensor | None = None  # silu(g) * u in the down kernel's dtype, reused
        for L in self.layers:
            # F.rms_norm is RMSNorm.forward's arithmetic (x * rsqrt(mean(x^2) + eps) * w,
            # fp32) as one op; tests/system/generate/test_forward.py holds it bit for bit.
            h = F.rms_norm(x, norm_shape, L.ln1, L.eps1)
            if L.qkv is not None:
                # q and k sit side by side in the fused product: rotated together, one set of
                # RoPE ops (elementwise, so each value is what rotating it alone gives).
                qkv = INT4_MM(h.to(L.qkv.dtype), L.qkv.packed, GROUP, L.qkv.scale_zero)
                qk, v = qkv.split_with_sizes(L.qk_v, dim=-1)
                qk = _rope(qk.view(b, t, L.heads + L.kv_heads, L.head_dim), cos, sin)
                q, k = qk.split_with_sizes((L.heads, L.kv_heads), dim=2)
                v = v.float()
            else:
                q = _rope(L.q(h).view(b, t, L.heads, L.head_dim), cos, sin)
                k = _rope(L.k(h).view(b, t, L.kv_heads, L.head_dim), cos, sin)
                v = L.v(h)
            out = attention(L.index, q, k, v.view(b, t, L.kv_heads, L.head_dim))
            out = out.reshape(b * t, L.heads * L.head_dim)
            # A raw (bf16) product added to fp32 x is promoted inside the add: the same sum.
            if L.o_raw is not None:
                p, sz, dt = L.o_raw
                x = x + INT4_MM(out.to(dt), p, GROUP, sz)
            else:
                x = x + L.o(out)
            h = F.rms_norm(x, norm_shape, L.ln2, L.eps2)
            if L.gate_up is not None:
                gu = INT4_MM(h.to(L.gate_up.dtype), L.gate_up.packed, GROUP,
                             L.gate_up.scale_zero).float()
                g, u = gu.split_with_sizes(L.gate_up.sizes, dim=-1)
                F.silu(g, inplace=True)
                if L.down_raw is not None:
                    p, sz, dt = L.down_raw
                    if act is None:
                        act = torch.empty(g.shape, dtype=dt)
                    # The product rounded to the kernel's dtype as it is written (as .to() does).
                    torch.mul(g, u, out=act)
                    x = x + INT4_MM(act, p, GROUP, sz)
                else:
                    x = x + L.down(g * u)
            else:
                x = x + L.down(F.silu(L.gate(h)) * L.up(h))
        x = F.rms_norm(x, norm_shape, self.norm, self.eps)
        return self.head(x[logits_at])
