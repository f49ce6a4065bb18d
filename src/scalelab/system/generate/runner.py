"""Runs one scheduled step through the model over a paged KV cache.

The pool is two tensors per engine, (layers, blocks * block_size, kv_heads, head_dim) for keys
and for values, preallocated once from a byte budget. A step packs every scheduled sequence's new
tokens into one (1, total_tokens) batch, so the linear layers see no padding; only attention
regroups them per sequence: it writes the new keys/values to their slots, gathers each
sequence's context through its block table, and runs one masked SDPA for the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.llama import LlamaConfig, LlamaForCausalLM
from scalelab.system.generate.forward import StepForward
from scalelab.system.generate.linears import PackedLinear


def kv_bytes_per_token(cfg: LlamaConfig, dtype: torch.dtype = torch.float32) -> int:
    """Keys + values of one token across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem


def blocks_in_budget(
    cfg: LlamaConfig, budget_bytes: int, block_size: int, dtype: torch.dtype = torch.float32
) -> int:
    return budget_bytes // (kv_bytes_per_token(cfg, dtype) * block_size)


def can_pack(model: nn.Module) -> bool:
    """oneDNN is there and the weights are fp32 on the CPU (what its blocked layout serves)."""
    if not torch.backends.mkldnn.is_available():
        return False
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "cpu" and p.dtype == torch.float32


def pack_linears(model: nn.Module) -> int:
    """Replace every bias-free `nn.Linear` in `model` by a `PackedLinear`, in place; the
    number replaced (0 when already packed). A tied output layer gets its own blocked copy and
    the embedding keeps the plain table."""
    n = 0
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if type(child) is nn.Linear and child.bias is None:
                setattr(mod, name, PackedLinear(child))
                n += 1
    if n:
        # Weights loaded from safetensors are views of one file mapping, which stays mapped (and
        # its touched pages resident) while any view lives. Copying out what stays plain (the
        # embedding, the norms) lets the mapping close: packed SmolLM2 then holds only the tied
        # output layer's blocked copy more than the plain model (RSS 1.02 against 0.90 GB after a
        # short generation; 1.45 GB with the mapping kept).
        with torch.no_grad():
            for p in model.parameters():
                p.data = p.data.clone()
    return n


@dataclass
class SeqSlice:
    """One sequence's part of a step (what the runner needs, nothing of the policy)."""

    tokens: list[int]
    """Tokens fed this step (new prompt chunk, or last token + drafts)."""
    start: int
    """Position of tokens[0]; everything before it is already in the cache."""
    block_table: list[int]
    logits_rows: int
    """How many of its last positions need logits (0 for a prefill chunk that ends mid-prompt)."""


def _consecutive(table: list[int], ctx: int, block_size: int) -> bool:
    """The blocks holding a sequence's first `ctx` slots are numbered one after another."""
    used = table[: -(-ctx // block_size)]
    return all(b == used[0] + i for i, b in enumerate(used))


class PagedAttention:
    """The AttentionBackend for one step: precomputed indices shared by every layer."""

    def __init__(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, slices: list[SeqSlice], block_size: int
    ) -> None:
        # Each layer's slab as a view, made once a step (one op, not two selects a layer).
        self.k_layers, self.v_layers = k_cache.unbind(0), v_cache.unbind(0)
        n = [len(s.tokens) for s in slices]
        ctx = [s.start + len(s.tokens) for s in slices]
        self.batch, self.q_max, self.ctx_max = len(slices), max(n), max(ctx)
        self.uniform = all(x == n[0] for x in n)
        offs = torch.arange(block_size)
        slot_rows, gather_rows = [], []
        for s, c in zip(slices, ctx, strict=True):
            table = torch.tensor(s.block_table, dtype=torch.long)
            slots = (table[:, None] * block_size + offs).reshape(-1)[:c]
            slot_rows.append(slots[s.start :])
            gather_rows.append(F.pad(slots, (0, self.ctx_max - c)))
        self.slot_mapping = torch.cat(slot_rows)
        # Flat (batch * ctx_max,) slot list; padding reads slot 0, masked. index_select over
        # dim 0 copies whole rows (kv_heads * head_dim floats) and runs ~8x faster than the
        # general advanced index `kc[gather_2d]` on CPU: the gather copies every sequence's
        # context once per layer, so at 8 sequences it was ~7% of a decode step.
        self.gather = torch.cat(gather_rows)
        # One sequence whose blocks hold consecutive slots (a lone stream on a fresh pool):
        # its context is a slice of the cache, read in place instead of gathered (a copy of
        # the whole context per layer and tensor).
        self.span: tuple[int, int] | None = None
        if len(slices) == 1 and _consecutive(slices[0].block_table, ctx[0], block_size):
            self.span = (slices[0].block_table[0] * block_size, ctx[0])
        # (batch, 1, q_max, ctx_max); None where every query sees every key (a decode step of
        # sequences of one length, one stream always): SDPA then skips building and adding a
        # zero bias per layer, and its output is bit-identical (x + 0 = x).
        self.mask: torch.Tensor | None = None
        if self.q_max > 1 or any(c != self.ctx_max for c in ctx):
            # Query i of a sequence sits at position start + i and sees keys 0..start + i.
            qpos = torch.tensor([s.start for s in slices])[:, None] + torch.arange(self.q_max)
            kpos = torch.arange(self.ctx_max)
            mask = kpos[None, None, :] <= qpos[:, :, None]
            valid_q = torch.arange(self.q_max)[None, :] < torch.tensor(n)[:, None]
            # Padding query rows see key 0 only, so no row is fully masked (that would give NaN).
            mask &= valid_q[:, :, None] | (kpos == 0)[None, None, :]
            self.mask = mask[:, None]
        if not self.uniform:
            self.q_batch = torch.cat([torch.full((x,), i) for i, x in enumerate(n)])
            self.q_pos = torch.cat([torch.arange(x) for x in n])

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        kc, vc = self.k_layers[layer], self.v_layers[layer]
        kc.index_copy_(0, self.slot_mapping, k[0])
        vc.index_copy_(0, self.slot_mapping, v[0])
        t, h, d = q.shape[1:]
        shape = (self.batch, self.ctx_max, *kc.shape[1:])
        if self.span is not None:
            keys = kc[self.span[0] : self.span[0] + self.span[1]].view(shape)
            values = vc[self.span[0] : self.span[0] + self.span[1]].view(shape)
        else:  # (batch, ctx_max, kv_heads, head_dim)
            keys = kc.index_select(0, self.gather).view(shape)
            values = vc.index_select(0, self.gather).view(shape)
        if self.uniform:
            qb = q[0].view(self.batch, self.q_max, h, d)
        else:
            qb = q.new_zeros(self.batch, self.q_max, h, d)
            qb[self.q_batch, self.q_pos] = q[0]
        out = F.scaled_dot_product_attention(
            qb.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=self.mask,
            enable_gqa=h != keys.shape[2],
        ).transpose(1, 2)
        if self.uniform:
            return out.reshape(1, t, h, d)
        return out[self.q_batch, self.q_pos].unsqueeze(0)


class ModelRunner:
    """Owns the model and the KV pool; `run` returns logits for the rows each slice asks for."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        *,
        packed: bool = True,
    ) -> None:
        """packed: run the linear layers from oneDNN-blocked weights where `can_pack` (the
        model is changed in place, once, and stays so; see `PackedLinear`)."""
        if num_blocks < 1:
            raise BadUsageError("the KV cache budget holds no block; raise --kv-cache-bytes")
        cfg = model.cfg
        self.model = model.eval()
        if packed and can_pack(model):
            pack_linears(model)
        # What runs, not what was asked: a model an earlier engine packed stays packed.
        self.packed = any(isinstance(m, PackedLinear) for m in model.modules())
        # After packing: it holds the layers' forward methods as they are now.
        self.forward = StepForward(model)
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (cfg.num_layers, num_blocks * block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype)
        self.v_cache = torch.zeros(shape, dtype=dtype)

    @property
    def kv_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    @torch.inference_mode()
    def run(self, slices: list[SeqSlice]) -> torch.Tensor:
        """Logits (sum of logits_rows, vocab), sequence by sequence in order."""
        ids = torch.tensor([t for s in slices for t in s.tokens], dtype=torch.long)[None]
        positions = torch.cat([torch.arange(s.start, s.start + len(s.tokens)) for s in slices])[
            None
        ]
        rows: list[int] = []
        offset = 0
        for s in slices:
            end = offset + len(s.tokens)
            rows.extend(range(end - s.logits_rows, end))
            offset = end
        attention = PagedAttention(self.k_cache, self.v_cache, slices, self.block_size)
        logits_at = torch.tensor(rows, dtype=torch.long)
        return self.forward(ids, positions, attention, logits_at).float()
