"""Parallelisms applied to the Llama model, one small function each, composed once by
`parallelize` from the degrees in `ParallelDims` (the way torchtitan's `parallelize_llama`
does): pipeline stages cut the model first (each stage is then trained whole), else tensor
parallel (it rewrites the weights into DTensors on the TP mesh), then FSDP2 (which shards those
along the data-parallel mesh) or DDP (which replicates). A degree of 1 applies nothing.

Tensor parallel follows Megatron's split (Shoeybi et al. 2019): q/k/v and the MLP's gate/up
projections column-wise (each rank computes its heads / its slice of the inner width, no
communication), o_proj and down_proj row-wise (each rank's partial sum, then one all-reduce per
block half). The embedding is split by vocabulary rows (a masked lookup and an all-reduce), the
output head column-wise with the logits gathered whole before the loss. RMSNorm weights stay
replicated: their inputs are the (replicated) residual stream, so every rank computes the same
gradient and none needs communicating.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scalelab.layers.nets.llama import LlamaForCausalLM
from scalelab.system.train.parallel.dims import ParallelDims
from scalelab.system.train.parallel.measure import param_bytes
from scalelab.system.train.parallel.pipeline import StageModule, build_schedule


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """How a pipeline stage runs its step (used only when the pipeline degree is > 1)."""

    micro_batches: int
    """Micro-batches per step."""
    schedule: str
    """gpipe or 1f1b."""
    recv_ahead: bool
    """Post a step's receives ahead of need (pipeline.RecvAhead)."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """The loss the last stage computes per micro-batch."""


@dataclass(frozen=True, kw_only=True)
class Parallelized:
    """The model as this rank trains it."""

    model: nn.Module
    """What holds this rank's parameters (the optimizer's): the model, or its pipeline stage."""
    forward: nn.Module
    """What runs the forward pass: the DDP wrapper, or `model` itself."""
    schedule: Any = None
    """The pipeline schedule that runs a step (forward and backward), when pipelined."""
    clock: Any = None
    """The pipeline stage's busy clock (pipeline.BusyClock), when pipelined."""


def parallelize(model: LlamaForCausalLM, dims: ParallelDims, mesh: Any, *, rank: int,
                device: str, pipeline: PipelineSettings) -> Parallelized:
    """Apply every parallelism `dims` turns on to `model` (on `device`), over `mesh` (None for
    one rank)."""
    if dims.enabled("pp"):
        stage = StageModule(model, rank, dims.pp)
        schedule, clock = build_schedule(
            stage, stage=rank, stages=dims.pp, micro_batches=pipeline.micro_batches,
            schedule=pipeline.schedule, loss_fn=pipeline.loss_fn,
            group=dims.sub_mesh(mesh, "pp").get_group(), device=torch.device(device),
            recv_ahead=pipeline.recv_ahead)
        return Parallelized(model=stage, forward=stage, schedule=schedule, clock=clock)
    if dims.enabled("tp"):
        apply_tp(model, dims.sub_mesh(mesh, "tp"))
    if dims.enabled("dp_shard"):
        apply_fsdp(model, dims.sub_mesh(mesh, "dp_shard"), list(model.model.layers))
    elif dims.enabled("dp_replicate"):
        return Parallelized(model=model,
                            forward=apply_ddp(model, max(1.0, 2 * param_bytes(model) / 2**20)))
    return Parallelized(model=model, forward=model)


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
