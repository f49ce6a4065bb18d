"""The training loop one worker runs: data-parallel steps, timing, checkpoints, resume.

Works in a torchrun worker (process group initialised by worker.py) and in-process without a
process group (world 1; the scaling-law grid uses that to skip launch costs). Every rank builds
the model from the same seed, so replicas start identical without a broadcast.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from scalelab.nets.flights import CLASSES
from scalelab.nets.tabular import TabularConfig, TabularNet
from scalelab.train.checkpoint import (
    STATE_FILE,
    CheckpointStore,
    crash_point,
    rng_state,
    set_rng_state,
)
from scalelab.train.config import TabularRunConfig
from scalelab.train.dataset import BatchPlan, Tensors
from scalelab.train.metrics import (
    CommClock,
    StepTimes,
    count_params,
    optimizer_state_bytes,
    param_bytes,
    peak_rss_bytes,
    train_flops_per_sample,
)
from scalelab.train.rank import Rank
from scalelab.train.rundir import PROGRESS_EVERY_S, fail_now, write_progress
from scalelab.train.saver import Saver, daly_interval
from scalelab.train.schedule import default_warmup, lr_at


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


def _agree_max(d: Rank, values: list[float]) -> list[float]:
    """The elementwise max over ranks, so every rank takes the same decision."""
    if not d.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(x) for x in t]


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
    flops_per_sample = None
    if cfg.flop_count:
        idx = plan.indices(0, 0)
        flops_per_sample = train_flops_per_sample(
            net, lambda: (data.train_cat[idx].to(d.device), data.train_num[idx].to(d.device),
                          data.train_y[idx].to(d.device)))
    rep = Replica(cfg, net, d, total, global_batch)

    store = CheckpointStore(cfg.checkpoint_dir or run_dir / "checkpoints", keep=cfg.keep)
    run_key = cfg.run_key(d.world)
    saver = Saver(store, rank=d.rank, world=d.world, distributed=d.distributed,
                  asynchronous=cfg.async_checkpoint, run=run_key) if cfg.checkpoints_on() else None
    every = cfg.checkpoint_every or (max(1, total // 4) if cfg.rehearse_failure else 0)
    start, losses, resumed, skipped = 0, [], None, []
    if saver is not None:
        if d.rank == 0:
            store.clean_tmp()
        d.barrier()
        good, skipped_list = store.latest_good(run_key) if cfg.resume else (None, [])
        skipped = [vars(s) for s in skipped_list]
        if good is not None:
            t0 = time.perf_counter()
            state = store.load(good, STATE_FILE)
            mine = store.load(good, f"rank-{d.rank}.pt")
            rep.load(state["model"], state["optimizer"], state["scheduler"])
            set_rng_state(mine["rng"])
            start, losses = int(state["step"]), list(mine["losses"])
            resumed = {"step": good, "load_s": time.perf_counter() - t0}
        d.barrier()
        if d.rank == 0:
            # A kill between a commit's rename and its prune leaves keep + 1 checkpoints; when
            # that was the run's last save, nothing after the resume would prune them.
            store.prune(also_keep=good)
    d.barrier()
    failure = _choose_failure(cfg, d.world, every, total) if cfg.rehearse_failure else None

    times = StepTimes()
    on_device = d.device != "cpu"
    weights = class_weights(cfg, data.train_y, d.device)

    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # The plain mean of per-sample weighted losses, not CrossEntropyLoss(weight=...)'s
        # division by each batch's weight sum: that sum differs per rank, so DDP's average of
        # rank gradients would no longer equal the one-process gradient of the global batch.
        ce = nn.functional.cross_entropy(logits, y, reduction="none")
        return (ce * weights[y]).mean() if weights is not None else ce.mean()

    t_train = time.perf_counter()
    last_progress = 0.0
    first_step_done: float | None = None
    auto_probe = min(max(2, total // 10), total - 1) if cfg.checkpoint_auto else -1
    save_cost = None
    for step in range(start, total):
        if failure is not None and d.restart == 0 and step == failure[0] and d.rank == failure[1]:
            fail_now(run_dir, step=step, rank=d.rank,
                     last_checkpoint=store.steps()[-1] if store.steps() else None)
        crash_point("step", step, d.rank)
        t_step = time.perf_counter()
        step_loss = 0.0
        for micro in range(cfg.accumulation):
            t0 = time.perf_counter()
            idx = plan.indices(step, micro)
            cat, num, y = data.train_cat[idx], data.train_num[idx], data.train_y[idx]
            if on_device:
                cat, num, y = cat.to(d.device), num.to(d.device), y.to(d.device)
            t1 = time.perf_counter()
            with rep.no_sync(micro < cfg.accumulation - 1):
                loss = loss_fn(rep.module(cat, num), y)
                if cfg.accumulation > 1:
                    loss = loss / cfg.accumulation
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
        losses.append([step, step_loss])
        if first_step_done is None:
            first_step_done = time.time()
        done = step + 1
        if d.rank == 0 and (t5 - last_progress >= PROGRESS_EVERY_S or done == total):
            write_progress(run_dir, step=done, total=total, loss=step_loss)
            last_progress = t5
        if saver is not None and done < total:
            if done == auto_probe:
                _save(saver, rep, d, done, losses)
                saver.wait()
                cost, step_s = _agree_max(d, [saver.stats.write_s[-1],
                                              float(np.median(times.per_step))])
                save_cost = cost
                every = max(1, round(daly_interval(cost, cfg.mtbf_s) / max(step_s, 1e-9)))
            elif every and done % every == 0:
                _save(saver, rep, d, done, losses)
    train_wall = time.perf_counter() - t_train
    if saver is not None:
        saver.wait()
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
        "first_step_unix": first_step_done, "resumed_from": resumed, "skipped": skipped,
        "checkpoint": None if saver is None else {
            "interval_steps": every, "auto": cfg.checkpoint_auto, "save_cost_s": save_cost,
            "asynchronous": cfg.async_checkpoint, "saves": saver.stats.saves,
            "blocking_s": saver.stats.blocking_s, "write_s": saver.stats.write_s,
            "bytes": saver.stats.bytes, "dir": str(store.root),
        },
    }
    if d.rank != 0:
        return report, None, None
    if cfg.shard == "fsdp":
        plain = TabularNet(model_config(cfg, cardinalities, int(data.train_num.shape[1])))
        plain.load_state_dict(full)
        return report, plain, plain.state_dict()
    return report, net, full


def _save(saver: Saver, rep: Replica, d: Rank, step: int, losses: list[list[float]]) -> float:
    model, optim = rep.full_model_state(), rep.full_optimizer_state()
    files: dict[str, Any] = {f"rank-{d.rank}.pt": {"rng": rng_state(), "losses": losses,
                                                  "step": step}}
    if d.rank == 0:
        files[STATE_FILE] = {"model": model, "optimizer": optim,
                             "scheduler": rep.scheduler.state_dict(), "step": step,
                             "data_position": {"global_step": step}, "world": d.world}
    return saver.save(step, files)
