"""The training loop one worker runs: data-parallel steps and their timing; checkpoints and
resume are checkpointer.Checkpointer's, called from the loop, a rehearsed failure rundir's.

Works in a torchrun worker (process group initialised by worker.py) and in-process without a
process group (world 1; the scaling-law grid uses that to skip launch costs). Every rank builds
the model from the same seed, so replicas start identical without a broadcast.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.layers.nets.flights import CLASSES
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.system.train.checkpoint import crash_point
from scalelab.system.train.checkpointer import Checkpointer
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.dataset import BatchPlan, Tensors
from scalelab.system.train.metrics import (
    CommClock,
    StepTimes,
    count_params,
    optimizer_state_bytes,
    param_bytes,
    peak_rss_bytes,
    train_flops_per_sample,
)
from scalelab.system.train.rank import Rank
from scalelab.system.train.rundir import ProgressWriter, fail_now
from scalelab.system.train.schedule import default_warmup, lr_at


def model_config(cfg: TabularRunConfig, cardinalities: list[int], n_numeric: int) -> TabularConfig:
    return TabularConfig(cardinalities=cardinalities, n_numeric=n_numeric, hidden=list(cfg.hidden))


def class_weights(cfg: TabularRunConfig, y: torch.Tensor, device: str) -> torch.Tensor | None:
    """Balanced class weights n / (k · n_c) from all training labels (identical on every rank,
    since every rank holds the same rows); a class absent from the rows gets weight 0."""
    if cfg.class_weights == "none":
        return None
    k = len(CLASSES)
    counts = torch.bincount(y.long(), minlength=k).double()
    w = torch.where(counts > 0, counts.sum() / (k * counts.clamp(min=1)), torch.zeros_like(counts))
    return w.float().to(device)


class Replica:
    """The model as this rank trains it (plain, DDP, DDP + ZeRO, or FSDP2) and its optimizer."""

    def __init__(self, cfg: TabularRunConfig, net: TabularNet, d: Rank, total_steps: int,
                 global_batch: int) -> None:
        self.cfg, self.net, self.d = cfg, net, d
        self.clock = CommClock()
        self.ddp: nn.Module | None = None
        module: nn.Module = net
        if cfg.shard == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(net)
        elif d.distributed and d.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            # One bucket holding every gradient: the all-reduce starts after backward finished,
            # so the comm hook's time is pure communication (see metrics.py).
            mb = max(1.0, 2 * param_bytes(net) / 2**20)
            module = DDP(net, bucket_cap_mb=mb)
            # A lambda: DDP rejects hooks whose `bucket` annotation is not dist.GradBucket itself,
            # and postponed annotations make ours a string.
            module.register_comm_hook(None, lambda state, bucket: self.clock.hook(state, bucket))
            self.ddp = module
        self.module = module
        opt_kwargs: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay,
                                      "foreach": False}
        if cfg.shard == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
                net.parameters(), optimizer_class=torch.optim.AdamW, **opt_kwargs)
        else:
            self.optimizer = torch.optim.AdamW(net.parameters(), **opt_kwargs)
        self.warmup = default_warmup(cfg.warmup_steps, batch=global_batch,
                                     base_batch=cfg.base_batch, total_steps=total_steps)

        def factor(step: int) -> float:
            return lr_at(step, base_lr=cfg.lr, base_batch=cfg.base_batch, batch=global_batch,
                         warmup=self.warmup) / cfg.lr

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)

    @contextlib.contextmanager
    def no_sync(self, skip: bool) -> Iterator[None]:
        """Skip the gradient all-reduce on this micro-step (all but the last of an accumulation)."""
        if not skip:
            yield
        elif self.cfg.shard == "fsdp":
            self.net.set_requires_gradient_sync(False)  # type: ignore[operator]
            try:
                yield
            finally:
                self.net.set_requires_gradient_sync(True)  # type: ignore[operator]
        elif self.ddp is not None:
            with self.ddp.no_sync():  # type: ignore[operator]
                yield
        else:
            yield

    def full_model_state(self) -> dict[str, Any]:
        """The unsharded weights (collective under FSDP; rank 0 gets them)."""
        if self.cfg.shard == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            return get_model_state_dict(
                self.net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.net.state_dict()

    def full_optimizer_state(self) -> dict[str, Any]:
        """The whole optimizer state on rank 0 (collective under ZeRO and FSDP)."""
        if self.cfg.shard == "zero":
            self.optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
            return self.optimizer.state_dict() if self.d.rank == 0 else {}
        if self.cfg.shard == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_optimizer_state_dict,
            )

            return get_optimizer_state_dict(
                self.net, self.optimizer,
                options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.optimizer.state_dict()

    def load(self, model: dict[str, Any], optimizer: dict[str, Any],
             scheduler: dict[str, Any]) -> None:
        if self.cfg.shard == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            set_model_state_dict(self.net, model, options=opts)
            set_optimizer_state_dict(self.net, self.optimizer, optimizer, options=opts)
        else:
            self.net.load_state_dict(model)
            self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(scheduler)


def _choose_failure(cfg: TabularRunConfig, world: int, every: int,
                    total: int) -> tuple[int, int] | None:
    """(step, rank) the rehearsal kills: after the first checkpoint, before the last step."""
    lo = every + 1
    if total - 1 < lo:
        return None
    rng = random.Random(cfg.seed * 7919 + 17)
    return rng.randint(lo, total - 1), rng.randrange(world)


def _loss_fn(cfg: TabularRunConfig, data: Tensors,
             device: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    weights = class_weights(cfg, data.train_y, device)

    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # The plain mean of per-sample weighted losses, not CrossEntropyLoss(weight=...)'s
        # division by each batch's weight sum: that sum differs per rank, so DDP's average of
        # rank gradients would no longer equal the one-process gradient of the global batch.
        ce = nn.functional.cross_entropy(logits, y, reduction="none")
        return (ce * weights[y]).mean() if weights is not None else ce.mean()

    return loss_fn


def _flops_per_sample(cfg: TabularRunConfig, net: TabularNet, data: Tensors, plan: BatchPlan,
                      device: str) -> float | None:
    if not cfg.flop_count:
        return None
    idx = plan.indices(0, 0)
    return train_flops_per_sample(net, lambda: (data.train_cat[idx].to(device),
                                                data.train_num[idx].to(device),
                                                data.train_y[idx].to(device)))


def _step(rep: Replica, step: int, *, plan: BatchPlan, data: Tensors,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
          times: StepTimes) -> float:
    """One optimizer step over `accumulation` micro-batches, each phase timed; its loss."""
    accumulation, device = rep.cfg.accumulation, rep.d.device
    t_step = time.perf_counter()
    step_loss = 0.0
    for micro in range(accumulation):
        t0 = time.perf_counter()
        idx = plan.indices(step, micro)
        cat, num, y = data.train_cat[idx], data.train_num[idx], data.train_y[idx]
        if device != "cpu":
            cat, num, y = cat.to(device), num.to(device), y.to(device)
        t1 = time.perf_counter()
        with rep.no_sync(micro < accumulation - 1):
            loss = loss_fn(rep.module(cat, num), y)
            if accumulation > 1:
                loss = loss / accumulation
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
        comm = rep.clock.take()
        times.add("data", t1 - t0)
        times.add("forward", t2 - t1)
        times.add("backward", (t3 - t2) - comm)
        times.add("comm", comm)
        # .item() is a device sync on CUDA (once per micro-step); free on CPU.
        step_loss += loss.item()
    t4 = time.perf_counter()
    rep.optimizer.step()
    rep.optimizer.zero_grad(set_to_none=True)
    rep.scheduler.step()
    t5 = time.perf_counter()
    times.add("optimizer", t5 - t4)
    times.steps += 1
    times.per_step.append(t5 - t_step)
    return step_loss


def train(cfg: TabularRunConfig, data: Tensors, cardinalities: list[int], d: Rank, *,
          run_dir: Path) -> tuple[dict[str, Any], nn.Module | None, dict[str, Any] | None]:
    """Train; returns (this rank's report, the unsharded net on rank 0, its full state)."""
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    random.seed(cfg.seed)
    net = TabularNet(model_config(cfg, cardinalities, int(data.train_num.shape[1])))
    net.to(d.device)
    global_batch = cfg.global_batch(d.world)
    cfg.local_batch(d.world)  # validates the split
    plan = BatchPlan(n=data.n_train, seed=cfg.seed, global_batch=global_batch, world=d.world,
                     rank=d.rank, accumulation=cfg.accumulation)
    total = cfg.max_steps or cfg.epochs * plan.steps_per_epoch
    flops_per_sample = _flops_per_sample(cfg, net, data, plan, d.device)
    rep = Replica(cfg, net, d, total, global_batch)
    ckpts = Checkpointer(cfg, d, rep, run_dir=run_dir, total=total)
    start, losses = ckpts.resume()
    failure = _choose_failure(cfg, d.world, ckpts.every, total) if cfg.rehearse_failure else None
    times = StepTimes()
    loss_fn = _loss_fn(cfg, data, d.device)
    progress = ProgressWriter(run_dir, rank=d.rank, total=total)
    t_train = time.perf_counter()
    first_step_done: float | None = None
    for step in range(start, total):
        if failure is not None and (d.restart, step, d.rank) == (0, *failure):
            fail_now(run_dir, step=step, rank=d.rank, last_checkpoint=ckpts.last_step())
        crash_point("step", step, d.rank)
        step_loss = _step(rep, step, plan=plan, data=data, loss_fn=loss_fn, times=times)
        losses.append([step, step_loss])
        if first_step_done is None:
            first_step_done = time.time()
        progress.step(step + 1, step_loss)
        ckpts.after_step(step + 1, losses, times.per_step)
    train_wall = time.perf_counter() - t_train
    ckpts.finish()
    full = rep.full_model_state()
    report: dict[str, Any] = {
        "rank": d.rank, "world": d.world, "restart": d.restart, "start_step": start,
        "total_steps": total, "steps_run": times.steps, "global_batch": global_batch,
        "local_batch": global_batch // d.world, "accumulation": cfg.accumulation,
        "warmup_steps": rep.warmup, "peak_lr": lr_at(total, base_lr=cfg.lr,
                                                   base_batch=cfg.base_batch, batch=global_batch,
                                                   warmup=rep.warmup),
        "losses": losses, "train_wall_s": train_wall, "phase_s": times.totals,
        "phase_ms_per_step": times.mean_ms(), "step_s": times.per_step,
        "flops_per_sample": flops_per_sample, "n_params": count_params(net),
        "param_bytes": param_bytes(net),
        "optimizer_state_bytes": optimizer_state_bytes(rep.optimizer),
        "peak_rss_bytes": peak_rss_bytes(),
        "cuda_max_allocated_bytes": (torch.cuda.max_memory_allocated()
                                     if d.device.startswith("cuda") else None),
        "first_step_unix": first_step_done, "resumed_from": ckpts.resumed,
        "skipped": ckpts.skipped, "checkpoint": ckpts.report(),
    }
    if d.rank != 0:
        return report, None, None
    if cfg.shard == "fsdp":
        plain = TabularNet(model_config(cfg, cardinalities, int(data.train_num.shape[1])))
        plain.load_state_dict(full)
        return report, plain, plain.state_dict()
    return report, net, full
