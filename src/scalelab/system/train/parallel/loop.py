"""The transformer's training loop on one rank, for every strategy.

Every rank builds the whole model from the same seed (so replicas and shards start from the
same numbers without a broadcast), then the strategy's degrees (ParallelDims, built once) are
applied by apply.parallelize: nothing (single), DDP, FSDP2 per block, tensor parallel, FSDP2
over TP, or the rank's pipeline stage. The global batch of
step k is a pure function of k (text.batch_at); data-parallel ranks take their slice of it,
tensor-parallel peers the same slice, the pipeline splits it into micro-batches. The loss is the
mean token cross-entropy of the global batch under every strategy, so the loss curves compare.

Measured on the first step: activation bytes (saved-tensor hook) and, after the optimizer step,
parameter / gradient / optimizer-state bytes. Measured over `profile_steps` steps after it (under
torch.profiler): communication per kind. Step wall time on every step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from scalelab.layers.nets.llama import LlamaForCausalLM, init_weights
from scalelab.system.train.parallel import ckpt
from scalelab.system.train.parallel.apply import PipelineSettings, parallelize
from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.dims import ParallelDims
from scalelab.system.train.parallel.measure import (
    ActivationMeter,
    grad_bytes,
    optimizer_bytes,
    param_bytes,
)
from scalelab.system.train.parallel.probes import CommWindow, RssTimeline, StepLog
from scalelab.system.train.rank import Rank
from scalelab.system.train.rundir import ProgressWriter, fail_now
from scalelab.system.train.text import VOCAB_SIZE, batch_at


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), target.reshape(-1))


class Replica:
    """The model as this rank trains it, and how one step runs."""

    def __init__(self, cfg: ParallelConfig, r: Rank) -> None:
        self.cfg, self.r = cfg, r
        self.dims = ParallelDims.for_strategy(cfg.parallel.strategy, r.world, cfg.parallel.tp)
        full = init_weights(LlamaForCausalLM(cfg.model_config()), seed=cfg.seed).train()
        full.to(r.device)
        mesh: Any = self.dims.build_mesh(r.device.split(":")[0]) if r.world > 1 else None
        p = cfg.parallel
        par = parallelize(full, self.dims, mesh, rank=r.rank, device=r.device,
                          pipeline=PipelineSettings(micro_batches=p.micro_batches,
                                                    schedule=p.schedule,
                                                    recv_ahead=p.recv_ahead, loss_fn=_loss))
        del full
        self.model, self.forward_module = par.model, par.forward
        self.schedule: Any = par.schedule
        self.clock: Any = par.clock
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0,
                                           foreach=False)

    def local_rows(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the global batch (the whole batch for TP and the pipeline)."""
        dp = self.dims.dp
        if dp == 1:
            return batch
        per = batch.shape[0] // dp
        i = self.dims.dp_rank(self.r.rank)
        return batch[i * per:(i + 1) * per]

    def step(self, batch: torch.Tensor) -> float | None:
        """One forward + backward (no optimizer step); this rank's loss, None off the last
        pipeline stage."""
        rows = self.local_rows(batch).to(self.r.device)
        x, y = rows[:, :-1], rows[:, 1:]
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            if self.r.rank == 0 and self.r.world == 1:
                self.schedule.step(x, target=y, losses=losses)
            elif self.r.rank == 0:
                self.schedule.step(x)
            elif self.r.rank == self.r.world - 1:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
            return float(torch.stack(losses).mean()) if losses else None
        loss = _loss(self.forward_module(x), y)
        loss.backward()
        # .item() is a sync point on CUDA; free on CPU.
        return float(loss.item())

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """The unsharded weights on rank 0 (collective), None elsewhere."""
        if self.dims.sharded:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            sd: dict[str, Any] = get_model_state_dict(
                self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return {k: v.detach().cpu().clone() for k, v in sd.items()} if self.r.rank == 0 \
                else None
        local = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        if self.dims.enabled("pp"):
            parts: list[Any] = [None] * self.r.world if self.r.rank == 0 else []
            dist.gather_object(local, parts if self.r.rank == 0 else None, dst=0)
            if self.r.rank != 0:
                return None
            merged: dict[str, torch.Tensor] = {}
            for p in parts:
                merged.update(p)
            return merged
        return local if self.r.rank == 0 else None


def _global_losses(rep: Replica, local: list[float | None]) -> list[float]:
    """The global batch's loss per step, on every rank (one collective at the end)."""
    r = rep.r
    if r.world == 1:
        return [float(v) for v in local if v is not None]
    vals = torch.tensor([np.nan if v is None else v for v in local], dtype=torch.float64)
    if rep.dims.enabled("pp"):
        # Only the last stage has the loss.
        dist.broadcast(vals, src=r.world - 1)
        return [float(v) for v in vals]
    # Data-parallel groups hold equal shares of the batch, so the global mean is the mean of
    # the groups' means; TP peers hold the same value, which the mean leaves unchanged.
    dist.all_reduce(vals, op=dist.ReduceOp.SUM)
    return [float(v) / r.world for v in vals]


def train(cfg: ParallelConfig, data: torch.Tensor, r: Rank, *,
          run_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """Train; returns this rank's report and (rank 0) the full final weights."""
    torch.manual_seed(cfg.seed)
    rss = RssTimeline()
    rep = Replica(cfg, r)
    rss.mark("model built")
    ck = cfg.checkpoint
    ckpts = ckpt.Checkpoints(
        every=ck.every, resume=ck.resume, root=Path(ck.dir) if ck.dir else run_dir / "checkpoints",
        run_key=cfg.run_key(r.world), rank=r.rank, total=cfg.steps,
        meta={"world": r.world, "strategy": cfg.parallel.strategy})
    start, resumed = ckpts.resume(rep.model, rep.optimizer)
    meter = ActivationMeter(rep.model)
    states: dict[str, int] = {}
    # Activations are counted on the second step (the first also runs the pipeline's shape
    # inference and warms caches); the profiler runs on the last steps (see CommWindow).
    meter_step = min(start + 1, cfg.steps - 1)
    prof = CommWindow(range(max(meter_step + 1, cfg.steps - cfg.measure.profile_steps),
                            cfg.steps))
    log = StepLog(start=start)
    progress = ProgressWriter(run_dir, rank=r.rank, total=cfg.steps)
    for step in range(start, cfg.steps):
        if ck.fail_at_step is not None and (r.restart, step, r.rank) == (0, ck.fail_at_step,
                                                                          ck.fail_rank):
            fail_now(run_dir, step=step, rank=r.rank)
        batch = batch_at(data, step, cfg.data.batch)
        prof.enter(step)
        t0, cpu0 = time.perf_counter(), time.process_time()
        if step == meter_step:
            meter.reset()
            with meter.track():
                loss = rep.step(batch)
            states["activation_bytes"] = meter.peak
        else:
            loss = rep.step(batch)
        sched, step_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        grads = grad_bytes(rep.model)
        rep.optimizer.step()
        rep.optimizer.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        profiled = prof.exit(wall)
        if step == start:
            states.update(param_bytes=param_bytes(rep.model), grad_bytes=grads,
                          optimizer_bytes=optimizer_bytes(rep.optimizer))
        rss.mark(f"step {step}" + (" (profiled)" if profiled else "")
                 + (" (activations counted)" if step == meter_step else ""))
        if rep.clock is not None:
            log.busy_s.append((*rep.clock.take_all(), step_cpu))
        log.add(loss, wall=wall, sched=sched)
        # A pipeline's rank 0 holds no loss (NaN in the live progress).
        progress.step(step + 1, float(loss) if isinstance(loss, int | float) else float("nan"))
        ckpts.after_step(step + 1, rep.model, rep.optimizer)
    losses = _global_losses(rep, log.losses)
    report: dict[str, Any] = {
        "rank": r.rank, "world": r.world, "restart": r.restart, "strategy": cfg.parallel.strategy,
        "dims": vars(rep.dims), "start_step": start, "steps_run": len(log.step_s),
        "losses": [[start + i, v] for i, v in enumerate(losses)], "step_s": log.step_s,
        "resumed_from": resumed, "first_step_unix": log.first_step_unix,
        "n_params_local": sum(int(p.numel()) for p in rep.model.parameters()),
        **states, **prof.report(), **rss.report(),
    }
    if rep.clock is not None and log.busy_s:
        p = cfg.parallel
        report["pipeline"] = log.pipeline_report(
            stages=r.world, micro_batches=p.micro_batches, schedule=p.schedule,
            recv_ahead=p.recv_ahead, skip_steps={meter_step, *prof.window})
    return report, rep.full_state()
