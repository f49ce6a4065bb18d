"""Parallelisms applied to the Llama model, one small function each, in a fixed order:
tensor parallel first (it rewrites the weights into DTensors on the TP mesh), then FSDP2 (which
shards those along the data-parallel mesh) or DDP (which replicates).

Tensor parallel follows Megatron's split (Shoeybi et al. 2019): q/k/v and the MLP's gate/up
projections column-wise (each rank computes its heads / its slice of the inner width, no
communication), o_proj and down_proj row-wise (each rank's partial sum, then one all-reduce per
block half). The embedding is split by vocabulary rows (a masked lookup and an all-reduce), the
output head column-wise with the logits gathered whole before the loss. RMSNorm weights stay
replicated: their inputs are the (replicated) residual stream, so every rank computes the same
gradient and none needs communicating.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scalelab.nets.llama import LlamaForCausalLM


def apply_tp(model: LlamaForCausalLM, tp_mesh: Any) -> None:
    """Shard every block's attention and MLP, the embedding and the head over `tp_mesh`."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    })
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        })
        # The attention module views its projections as (batch, time, heads, head_dim); each
        # rank now holds 1/tp of the heads (config.check_world made them divisible).
        attn: Any = layer.self_attn
        attn.num_heads //= tp
        attn.num_kv_heads //= tp


def apply_fsdp(model: nn.Module, dp_mesh: Any, blocks: list[nn.Module]) -> None:
    """FSDP2: each block is one unit (its parameters all-gathered just before it runs and freed
    after), the root holds the rest (embedding, final norm, head)."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def apply_ddp(model: nn.Module, bucket_mb: float) -> nn.Module:
    """DDP with one gradient bucket holding every gradient, so the all-reduce starts after
    backward and its time is pure communication (what it costs: no overlap with backward)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    # No buffer broadcast: the only buffers are RoPE's cos/sin tables, the same on every rank
    # by construction; broadcasting them each forward would add a collective per step.
    return DDP(model, bucket_cap_mb=bucket_mb, broadcast_buffers=False)
