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

from scalelab.nets.llama import LlamaForCausalLM, init_weights
from scalelab.train.metrics import peak_rss_bytes
from scalelab.train.parallel import ckpt
from scalelab.train.parallel.apply import PipelineSettings, parallelize
from scalelab.train.parallel.config import ParallelConfig
from scalelab.train.parallel.dims import ParallelDims
from scalelab.train.parallel.measure import (
    ActivationMeter,
    CommStats,
    comm_from_events,
    grad_bytes,
    optimizer_bytes,
    param_bytes,
    profiler_events,
    rss_status,
)
from scalelab.train.parallel.pipeline import bubble_theory
from scalelab.train.rank import Rank
from scalelab.train.rundir import PROGRESS_EVERY_S, fail_now, write_progress
from scalelab.train.text import VOCAB_SIZE, batch_at


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
        if self.dims.pp_enabled:
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
    if rep.dims.pp_enabled:
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
    rss_before = peak_rss_bytes()
    timeline = [("before model", rss_status())]
    rep = Replica(cfg, r)
    timeline.append(("model built", rss_status()))
    run_key = cfg.run_key(r.world)
    root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else run_dir / "checkpoints"
    start, resumed = 0, None
    if cfg.checkpoint.resume and cfg.checkpoint.every:
        found = ckpt.complete_steps(root, run_key)
        if found:
            t0 = time.perf_counter()
            ckpt.load(root, found[-1], rep.model, rep.optimizer)
            start = found[-1]
            resumed = {"step": start, "load_s": time.perf_counter() - t0}
    meter = ActivationMeter(rep.model)
    local_losses: list[float | None] = []
    step_s: list[float] = []
    busy_s: list[tuple[float, float, list[list[Any]], float]] = []
    """Per step, pipeline only: chunk wall, chunk CPU, the chunks, process CPU over the step."""
    sched_s: list[float] = []
    """Forward + backward only (the pipeline schedule's step, without the optimizer)."""
    comm = CommStats()
    profiled: list[float] = []
    states: dict[str, int] = {}
    # Activations are counted on the second step (the first also runs the pipeline's shape
    # inference and warms caches). The profiler runs on the last steps: its event buffers add
    # ~130 MiB of RSS that the allocator keeps after it stops, so the training's own peak RSS
    # (`peak_rss_bytes`, what the planner predicts) is read just before it starts.
    meter_step = min(start + 1, cfg.steps - 1)
    prof_range = range(max(meter_step + 1, cfg.steps - cfg.measure.profile_steps), cfg.steps)
    train_peak: int | None = None
    first_step_unix = None
    last_progress = 0.0
    for step in range(start, cfg.steps):
        ck = cfg.checkpoint
        if (ck.fail_at_step is not None and r.restart == 0 and step == ck.fail_at_step
                and r.rank == ck.fail_rank):
            fail_now(run_dir, step=step, rank=r.rank)
        batch = batch_at(data, step, cfg.data.batch)
        prof = None
        if step in prof_range and train_peak is None:
            train_peak = peak_rss_bytes()
        if step in prof_range:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
            prof.__enter__()
        t0, cpu0 = time.perf_counter(), time.process_time()
        if step == meter_step:
            meter.reset()
            with meter.track():
                loss = rep.step(batch)
            states["activation_bytes"] = meter.peak
        else:
            loss = rep.step(batch)
        sched_s.append(time.perf_counter() - t0)
        step_cpu = time.process_time() - cpu0
        grads = grad_bytes(rep.model)
        rep.optimizer.step()
        rep.optimizer.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        if prof is not None:
            prof.__exit__(None, None, None)
            c = comm_from_events(profiler_events(prof))
            for k in c.calls:
                comm.calls[k] += c.calls[k]
                comm.seconds[k] += c.seconds[k]
                comm.bytes[k] += c.bytes[k]
            profiled.append(wall)
        if step == start:
            states.update(param_bytes=param_bytes(rep.model), grad_bytes=grads,
                          optimizer_bytes=optimizer_bytes(rep.optimizer))
        step_s.append(wall)
        timeline.append((f"step {step}" + (" (profiled)" if prof is not None else "")
                         + (" (activations counted)" if step == meter_step else ""),
                         rss_status()))
        if rep.clock is not None:
            busy_s.append((*rep.clock.take_all(), step_cpu))
        local_losses.append(loss)
        if first_step_unix is None:
            first_step_unix = time.time()
        done = step + 1
        if r.rank == 0 and (time.perf_counter() - last_progress >= PROGRESS_EVERY_S
                            or done == cfg.steps):
            # for the launcher's live progress; a pipeline's rank 0 holds no loss (NaN)
            write_progress(run_dir, step=done, total=cfg.steps,
                           loss=float(loss) if isinstance(loss, int | float) else float("nan"))
            last_progress = time.perf_counter()
        if cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done < cfg.steps:
            ckpt.save(root, done, rep.model, rep.optimizer, run_key=run_key, rank=r.rank,
                      meta={"world": r.world, "strategy": cfg.parallel.strategy})
    losses = _global_losses(rep, local_losses)
    n_prof = len(profiled)
    comm_s = comm.total_seconds() / n_prof if n_prof else None
    prof_wall = float(np.mean(profiled)) if profiled else None
    report: dict[str, Any] = {
        "rank": r.rank, "world": r.world, "restart": r.restart, "strategy": cfg.parallel.strategy,
        "dims": vars(rep.dims), "start_step": start, "steps_run": len(step_s),
        "losses": [[start + i, v] for i, v in enumerate(losses)], "step_s": step_s,
        "resumed_from": resumed, "first_step_unix": first_step_unix,
        "n_params_local": sum(int(p.numel()) for p in rep.model.parameters()),
        **states,
        "peak_rss_bytes": peak_rss_bytes() if train_peak is None else train_peak,
        "peak_rss_profiled_bytes": peak_rss_bytes(), "rss_before_model_bytes": rss_before,
        "rss_timeline": [[label, st.get("rss"), st.get("hwm"), st.get("malloc_free")]
                         for label, st in timeline],
        "profiled_steps": n_prof, "profiled_step_ms": None if prof_wall is None
        else 1e3 * prof_wall,
        "comm_ms_per_step": None if comm_s is None else 1e3 * comm_s,
        "compute_ms_per_step": None if comm_s is None or prof_wall is None
        else 1e3 * max(0.0, prof_wall - comm_s),
        "comm": comm.per_step(n_prof) if n_prof else {},
    }
    if rep.clock is not None and busy_s:
        # The bubble is the schedule's: idle time within forward + backward, the optimizer step
        # apart. Left out where others remain: the first step (it also infers the shapes
        # between stages), the activation-counting step and the profiled ones (hooks and the
        # profiler slow compute, not the transfers).
        skip = {0, meter_step - start, *(i - start for i in prof_range)}
        kept = [i for i in range(len(sched_s)) if i not in skip] or list(range(1, len(sched_s))) \
            or list(range(len(sched_s)))
        step_wall = [sched_s[i] for i in kept]
        busy = [busy_s[i][0] for i in kept]
        cpu = [busy_s[i][1] for i in kept]
        report["pipeline"] = {
            "stages": r.world, "micro_batches": cfg.parallel.micro_batches,
            "schedule": cfg.parallel.schedule,
            "recv_ahead": cfg.parallel.recv_ahead,
            "bubble_theory": bubble_theory(r.world, cfg.parallel.micro_batches),
            "bubble_measured": float(np.median([1 - b / w for w, b in zip(step_wall, busy,
                                                                           strict=True)])),
            "busy_ms_per_step": 1e3 * float(np.median(busy)),
            "busy_cpu_ms_per_step": 1e3 * float(np.median(cpu)),
            # Inside a chunk but off the CPU (another process had the core), as a share of the
            # step: idle time theory does not know and a core per stage would not have.
            "descheduled_share": float(np.median([(b - c) / w for w, b, c in zip(
                step_wall, busy, cpu, strict=True)])),
            "process_cpu_share": float(np.median([busy_s[i][3] / sched_s[i] for i in kept])),
            "step_ms": [1e3 * w for w in step_wall],
            # Each kept step's chunks, [kind, micro-batch, cpu_s, wall_s], in the order run:
            # the summary replays every stage's together (pipeline.replay).
            "chunks_by_step": {str(start + i): busy_s[i][2] for i in kept},
        }
    return report, rep.full_state()
