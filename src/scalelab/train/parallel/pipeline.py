"""Pipeline parallelism: the Llama model cut into stages, run by a torch.distributed.pipelining
schedule (GPipe or 1F1B) over micro-batches, with each stage's busy time measured.

A stage keeps the full model's parameter names (`model.layers.3.mlp.up_proj.weight`), because
its layers sit in a ModuleDict keyed by their original index: checkpoints and weight
comparisons line up with every other strategy's without a translation table.

The bubble: with p stages and m micro-batches of equal cost, each stage idles for p − 1 of the
m + p − 1 slots of a GPipe step, a fraction (p − 1)/(m + p − 1) (Huang et al. 2019); 1F1B
(Narayanan et al. 2021) has the same bubble and holds fewer micro-batches' activations. The
measured bubble of a stage is 1 − (time inside its forward and backward chunks) / (step wall
time); what separates it from theory is the point-to-point transfers and the schedule's own
bookkeeping, which theory counts as zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from scalelab.core.errors import BadUsageError
from scalelab.nets.llama import LlamaForCausalLM


def bubble_theory(stages: int, micro_batches: int) -> float:
    """(p − 1)/(m + p − 1): the idle fraction of a GPipe or 1F1B step."""
    if stages < 1 or micro_batches < 1:
        raise BadUsageError("stages and micro-batches must be >= 1")
    return (stages - 1) / (micro_batches + stages - 1)


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """The layers of `stage`: ⌈L/p⌉ each from the front, the remainder on the last."""
    per = -(-layers // stages)
    return range(min(stage * per, layers), min((stage + 1) * per, layers))


class StageModule(nn.Module):
    """Stage `stage` of `stages`: the embedding on the first, the norm and head on the last."""

    def __init__(self, full: LlamaForCausalLM, stage: int, stages: int) -> None:
        super().__init__()
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.model = nn.Module()
        if self.is_first:
            self.model.embed_tokens = full.model.embed_tokens
        self.model.layers = nn.ModuleDict(
            {str(i): full.model.layers[i] for i in stage_layers(len(full.model.layers), stages,
                                                                stage)})
        # Non-persistent buffers: in no state dict, so no name to keep.
        self.model.rotary = full.model.rotary
        if self.is_last:
            self.model.norm = full.model.norm
            self.lm_head = full.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts: Any = self.model
        h = parts.embed_tokens(x) if self.is_first else x
        b, t = h.shape[0], h.shape[1]
        positions = torch.arange(t, device=h.device).expand(b, t)
        cos, sin = parts.rotary(positions)
        for layer in parts.layers.values():
            h = layer(h, cos, sin)
        if self.is_last:
            head: Any = self.lm_head
            out: torch.Tensor = head(parts.norm(h))
            return out
        return h


class BusyClock:
    """Seconds a stage spends inside its forward and backward chunks (its compute)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


def build_schedule(module: StageModule, *, stage: int, stages: int, micro_batches: int,
                   schedule: str, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   group: Any, device: torch.device) -> tuple[Any, BusyClock]:
    """The PipelineStage and its schedule; gradients are divided by m (scale_grads), so a step
    equals one full-batch step of the mean loss."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if schedule == "1f1b" and micro_batches < stages:
        raise BadUsageError(f"1F1B needs at least as many micro-batches as stages "
                            f"({stages}); got --micro-batches {micro_batches}")
    ps = PipelineStage(module, stage, stages, device, group=group)
    clock = BusyClock()
    ps.forward_one_chunk = clock.wrap(ps.forward_one_chunk)  # type: ignore[method-assign]
    ps.backward_one_chunk = clock.wrap(ps.backward_one_chunk)  # type: ignore[method-assign]
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    return cls(ps, n_microbatches=micro_batches, loss_fn=loss_fn, scale_grads=True), clock
