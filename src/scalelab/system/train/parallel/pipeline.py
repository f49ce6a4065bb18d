"""Pipeline parallelism: the Llama model cut into stages, run by a torch.distributed.pipelining
schedule (GPipe or 1F1B) over micro-batches, with each stage's busy time measured.

A stage keeps the full model's parameter names (`model.layers.3.mlp.up_proj.weight`), because
its layers sit in a ModuleDict keyed by their original index: checkpoints and weight
comparisons line up with every other strategy's without a translation table.

The bubble: with p stages and m micro-batches of equal cost, each stage idles for p − 1 of the
m + p − 1 slots of a GPipe step, a fraction (p − 1)/(m + p − 1) (Huang et al. 2019); 1F1B
(Narayanan et al. 2021) has the same bubble and holds fewer micro-batches' activations. The
measured bubble of a stage is 1 − (wall time inside its forward and backward chunks and its
loss) / (step wall time). What separates it from theory, each measured: the stages' unequal
costs (`replay` of the chunks' CPU times on a core per stage with free transfers), the
machine (stages off the CPU while inside a chunk: chunk wall − CPU time; `bubble_floor`: p
stages on C < p cores cannot all be busy), and the point-to-point transfers and the schedule's
bookkeeping (the rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.llama import LlamaForCausalLM


def bubble_theory(stages: int, micro_batches: int) -> float:
    """(p − 1)/(m + p − 1): the idle fraction of a GPipe or 1F1B step."""
    if stages < 1 or micro_batches < 1:
        raise BadUsageError("stages and micro-batches must be >= 1")
    return (stages - 1) / (micro_batches + stages - 1)


def bubble_floor(stages: int, micro_batches: int, cores: int) -> float:
    """The least idle fraction of a stage when p equal stages share C cores: a step takes at
    least (m + p − 1) chunk slots (the schedule) and at least p·m chunks' work spread over C
    cores, so a stage is busy m slots of max(m + p − 1, p·m/C):
    1 − min(m/(m + p − 1), C/p). With a core per stage (C ≥ p) it is the theory."""
    if cores < 1:
        raise BadUsageError(f"cores must be >= 1; got {cores}")
    theory = bubble_theory(stages, micro_batches)
    return max(theory, 1 - cores / stages)


Op = tuple[str, int, float]
"""One chunk a stage ran: kind ("F" forward, "B" backward), micro-batch, seconds."""


def replay(orders: list[list[Op]]) -> tuple[float, list[float]]:
    """The step a pipeline would take with a core per stage and free transfers: stage i runs
    its chunks in the order it ran them, F(i, j) after F(i − 1, j) and B(i, j) after
    B(i + 1, j) (the data each needs). Returns (makespan, each stage's busy seconds).

    Fed the chunks' measured CPU seconds, it separates what the schedule and the stages'
    unequal costs make idle (the bubble this pipeline has on a machine with a core per stage)
    from what transfers and a shared CPU add."""
    p = len(orders)
    done: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * p
    nxt = [0] * p
    while any(nxt[i] < len(orders[i]) for i in range(p)):
        progressed = False
        for i in range(p):
            while nxt[i] < len(orders[i]):
                kind, mb, secs = orders[i][nxt[i]]
                dep = (("F", i - 1, mb) if kind == "F" and i > 0 else
                       ("B", i + 1, mb) if kind == "B" and i < p - 1 else None)
                if dep is not None and dep not in done:
                    break
                start = max(clock[i], done[dep] if dep is not None else 0.0)
                clock[i] = done[(kind, i, mb)] = start + secs
                nxt[i] += 1
                progressed = True
        if not progressed:
            raise ValueError("the chunk orders deadlock: a stage waits on a chunk never run")
    return max(clock), [sum(op[2] for op in ops) for ops in orders]


def replay_bubble(orders: list[list[Op]]) -> float:
    """Mean over stages of 1 − busy / makespan of `replay`."""
    makespan, busy = replay(orders)
    return sum(1 - b / makespan for b in busy) / len(busy) if makespan > 0 else 0.0


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
    """Time a stage spends inside its forward and backward chunks (and the last stage's loss):
    wall seconds, this thread's CPU seconds, and each chunk in the order it ran (for `replay`).

    With one intra-op thread (the default when processes >= cores) the chunk's compute runs on
    the calling thread, so its thread CPU time is the compute itself and wall − CPU is time the
    stage wanted a core and did not have one. Gloo's transfers run on gloo's own threads."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.ops: list[list[Any]] = []
        """[kind, micro-batch, cpu_s, wall_s] per chunk since the last `take_all`."""

    def wrap(self, fn: Callable[..., Any], kind: str = "F") -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                self.seconds += wall
                self.cpu_seconds += cpu
                if kind == "L" and self.ops:
                    # The loss is the last stage's forward compute, run by the schedule just
                    # after forward_one_chunk: charged to that chunk.
                    self.ops[-1][2] += cpu
                    self.ops[-1][3] += wall
                else:
                    mb = args[0] if args and isinstance(args[0], int) else -1
                    self.ops.append([kind, mb, cpu, wall])
        return timed

    def take(self) -> float:
        return self.take_all()[0]

    def take_all(self) -> tuple[float, float, list[list[Any]]]:
        """(wall, cpu, chunks) since the last take; resets."""
        out = (self.seconds, self.cpu_seconds, self.ops)
        self.seconds, self.cpu_seconds, self.ops = 0.0, 0.0, []
        return out


class RecvAhead:
    """Posts a stage's receives for all of a step's micro-batches the first time the schedule
    asks for one of a kind (activations, gradients), and waits for micro-batch j's just before
    its chunk runs.

    torch's GPipe and 1F1B post each receive when they are about to use it, then wait: the
    payload, already sent, is read off the socket by gloo's thread only then, and with every
    core busy computing, that thread waits for one — on the critical path, once per
    micro-batch (measured on the two-core machine with other work running: `irecv` itself took
    ~2 ms of wall for 0.2 ms of CPU inside a pipeline, 0.14 ms alone). Posted ahead, each
    payload lands in its buffer
    while the stage computes the chunks before it. Every micro-batch has its own receive
    buffer (PipelineStage allocates one per chunk), and gloo matches receives from one peer in
    the order posted, the order the peer sends in, so the data is the same; the equivalence
    tests compare the losses with the single-process run's."""

    def __init__(self, ps: Any, micro_batches: int) -> None:
        self.m = micro_batches
        self.posted: dict[tuple[str, int], list[Any]] = {}
        self.getters = {"F": ps.get_fwd_recv_ops, "B": ps.get_bwd_recv_ops}
        ps.get_fwd_recv_ops = self._getter("F")
        ps.get_bwd_recv_ops = self._getter("B")

    def _getter(self, kind: str) -> Callable[[int], list[Any]]:
        import torch.distributed as dist

        def get(i: int) -> list[Any]:
            if (kind, i) not in self.posted:
                # First ask of this kind in the step: post the rest of the step's too.
                for j in range(i, self.m):
                    self.posted[(kind, j)] = [
                        dist.irecv(op.tensor, src=op.peer, group=op.group, tag=op.tag)
                        for op in self.getters[kind](j)]
            # The schedule waits on what it is given: nothing; `waiting` waits on ours.
            return []
        return get

    def waiting(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        """`fn` (a chunk) after micro-batch `args[0]`'s receives have landed."""
        def run(i: int, *args: Any, **kwargs: Any) -> Any:
            for work in self.posted.pop((kind, i), []):
                work.wait()
            return fn(i, *args, **kwargs)
        return run


def build_schedule(module: StageModule, *, stage: int, stages: int, micro_batches: int,
                   schedule: str, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   group: Any, device: torch.device,
                   recv_ahead: bool = True) -> tuple[Any, BusyClock]:
    """The PipelineStage and its schedule; gradients are divided by m (scale_grads), so a step
    equals one full-batch step of the mean loss. `recv_ahead`: receives posted ahead
    (`RecvAhead`) instead of when the schedule needs them."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if schedule == "1f1b" and micro_batches < stages:
        raise BadUsageError(f"1F1B needs at least as many micro-batches as stages "
                            f"({stages}); got --micro-batches {micro_batches}")
    ps = PipelineStage(module, stage, stages, device, group=group)
    clock = BusyClock()
    ps.forward_one_chunk = clock.wrap(ps.forward_one_chunk, "F")  # type: ignore[method-assign]
    ps.backward_one_chunk = clock.wrap(ps.backward_one_chunk, "B")  # type: ignore[method-assign]
    if recv_ahead and stages > 1:
        # Outside the clock: waiting for data is idle time, not the chunk's.
        ahead = RecvAhead(ps, micro_batches)
        ps.forward_one_chunk = ahead.waiting(ps.forward_one_chunk, "F")  # type: ignore[method-assign]
        ps.backward_one_chunk = ahead.waiting(ps.backward_one_chunk, "B")  # type: ignore[method-assign]
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    return cls(ps, n_microbatches=micro_batches, loss_fn=clock.wrap(loss_fn, "L"),
               scale_grads=True), clock
