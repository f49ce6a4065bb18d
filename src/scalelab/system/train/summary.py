"""One run's numbers, combined from every rank's report: rates, phase split, memory, recovery."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.metrics import PHASES, Throughput, throughput


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    rank: int
    peak_rss_bytes: int
    optimizer_state_bytes: int
    param_bytes: int
    cuda_max_allocated_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class CheckpointSummary:
    interval_steps: int
    auto: bool
    save_cost_s: float | None
    asynchronous: bool
    saves: int
    blocking_s_total: float
    blocking_s_mean: float | None
    write_s_mean: float | None
    blocking_share: float
    """Training time spent blocked on checkpoints in this run (rank 0, this attempt)."""
    steady_blocking_share: float | None
    """Mean blocking per save / (interval x median step time + it): the share a long run at this
    interval would lose, which a short run's `blocking_share` (one probe save) overstates."""
    bytes: int
    dir: str


@dataclass(frozen=True, kw_only=True)
class Recovery:
    failed_step: int
    failed_rank: int
    resumed_from_step: int | None
    redone_steps: int | None
    recovery_s: float | None
    """From the SIGKILL to the first completed step of the restarted group."""
    skipped_checkpoints: list[dict[str, str]]


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    world: int
    threads: int
    backend: str
    steps: int
    """Optimizer steps in the final attempt."""
    total_steps: int
    global_batch: int
    local_batch: int
    accumulation: int
    warmup_steps: int
    peak_lr: float
    train_wall_s: float
    median_step_s: float
    """Median over steps of the slowest rank's step time (robust to stalls from other load)."""
    rate: Throughput
    phase_ms_per_step: dict[str, float]
    comm_share: float
    flops_per_sample: float | None
    n_params: int
    loss_curve: list[list[float]]
    """[step, mean training loss over ranks]."""
    final_loss: float
    memory: list[RankMemory]
    checkpoint: CheckpointSummary | None
    recovery: Recovery | None


def summarize(cfg: TabularRunConfig, reports: list[dict[str, Any]],
              failure: dict[str, Any] | None) -> RunSummary:
    r0 = reports[0]
    world = int(r0["world"])
    wall = max(float(r["train_wall_s"]) for r in reports)
    steps = int(r0["steps_run"])
    phases = {p: statistics.fmean(float(r["phase_ms_per_step"][p]) for r in reports)
              for p in PHASES}
    total_ms = sum(phases.values())
    by_step: dict[int, list[float]] = {}
    for r in reports:
        for step, loss in r["losses"]:
            by_step.setdefault(int(step), []).append(float(loss))
    curve = [[s, statistics.fmean(v)] for s, v in sorted(by_step.items())]
    per_step = [max(col) for col in zip(*(r["step_s"] for r in reports), strict=False)]
    median_step = statistics.median(per_step) if per_step else float("nan")
    rate = throughput(samples=int(r0["global_batch"]) * steps, seconds=wall,
                      flops_per_sample=r0["flops_per_sample"], peak_flops=cfg.peak_flops,
                      world=world, price_per_hour=cfg.price_per_hour)
    ck = r0.get("checkpoint")
    ckpt = None
    if ck is not None:
        blocking = [float(x) for x in ck["blocking_s"]]
        writes = [float(x) for x in ck["write_s"]]
        mean_block = statistics.fmean(blocking) if blocking else None
        cycle = int(ck["interval_steps"]) * median_step
        steady = (mean_block / (cycle + mean_block) if mean_block is not None and cycle > 0
                  else None)
        ckpt = CheckpointSummary(
            interval_steps=int(ck["interval_steps"]), auto=bool(ck["auto"]),
            save_cost_s=ck["save_cost_s"], asynchronous=bool(ck["asynchronous"]),
            saves=int(ck["saves"]), blocking_s_total=sum(blocking),
            blocking_s_mean=mean_block, steady_blocking_share=steady,
            write_s_mean=statistics.fmean(writes) if writes else None,
            blocking_share=sum(blocking) / float(r0["train_wall_s"]) if r0["train_wall_s"] else 0.0,
            bytes=int(ck["bytes"]), dir=str(ck["dir"]))
    recovery = None
    if failure is not None:
        resumed = r0.get("resumed_from")
        starts = [r["first_step_unix"] for r in reports if r.get("first_step_unix")]
        recovery = Recovery(
            failed_step=int(failure["step"]), failed_rank=int(failure["rank"]),
            resumed_from_step=None if resumed is None else int(resumed["step"]),
            redone_steps=None if resumed is None else int(failure["step"]) - int(resumed["step"]),
            recovery_s=(max(starts) - float(failure["time"])) if starts else None,
            skipped_checkpoints=list(r0.get("skipped", [])))
    return RunSummary(
        world=world, threads=int(r0.get("threads", 1)), backend=str(r0.get("backend", "none")),
        steps=steps, total_steps=int(r0["total_steps"]), global_batch=int(r0["global_batch"]),
        local_batch=int(r0["local_batch"]), accumulation=int(r0["accumulation"]),
        warmup_steps=int(r0["warmup_steps"]), peak_lr=float(r0["peak_lr"]),
        train_wall_s=wall, median_step_s=median_step, rate=rate, phase_ms_per_step=phases,
        comm_share=phases["comm"] / total_ms if total_ms else 0.0,
        flops_per_sample=r0["flops_per_sample"], n_params=int(r0["n_params"]),
        loss_curve=curve, final_loss=curve[-1][1] if curve else float("nan"),
        memory=[RankMemory(rank=int(r["rank"]), peak_rss_bytes=int(r["peak_rss_bytes"]),
                           optimizer_state_bytes=int(r["optimizer_state_bytes"]),
                           param_bytes=int(r["param_bytes"]),
                           cuda_max_allocated_bytes=r.get("cuda_max_allocated_bytes"))
                for r in reports],
        checkpoint=ckpt, recovery=recovery,
    )
