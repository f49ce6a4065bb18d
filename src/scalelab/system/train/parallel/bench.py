"""The strategy sweep: one torchrun launch per (strategy, process count), as records, side by
side with DDP at the same process count.

Same transformer, same global batch, same steps at every level, so the only variables are the
strategy and the process count. Each level reports per-rank parameter + optimizer bytes against
DDP's (the target: FSDP and TP hold at most 1/W + 10% of it), tokens/s against DDP's, the
communication split, the pipeline bubble against theory, and the memory planner's prediction
against the measured model-state + activation bytes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.machine import available_cores
from scalelab.lab.core.records import Record, make_record
from scalelab.lab.core.signals import Resources
from scalelab.system.train.launch import LaunchConfig
from scalelab.system.train.parallel.config import STRATEGIES, ParallelConfig
from scalelab.system.train.parallel.job import ParallelResult, run_parallel
from scalelab.system.train.parallel.pipeline import bubble_floor, replay_bubble


def state_bytes(rank: dict[str, Any]) -> int:
    """Parameters + optimizer state this rank holds."""
    return int(rank["param_bytes"]) + int(rank["optimizer_bytes"])


def tracked_bytes(rank: dict[str, Any]) -> int:
    """What the memory planner predicts: parameters, gradients, optimizer state, activations."""
    return sum(int(rank[k]) for k in ("param_bytes", "grad_bytes", "optimizer_bytes",
                                      "activation_bytes"))


def peak_rss_error(result: ParallelResult) -> float | None:
    """Relative error of the planned peak RSS (plan["peak_rss"]) against the busiest rank's
    measured peak RSS (VmHWM before the profiler)."""
    if result.plan is None or "peak_rss" not in result.plan:
        return None
    measured = max(int(r["peak_rss_bytes"]) for r in result.ranks)
    return (int(result.plan["peak_rss"]["peak_rss_bytes"]) - measured) / measured


def replayed_bubble(result: ParallelResult) -> float | None:
    """The bubble of this run's own chunks replayed with a core per stage and free transfers
    (pipeline.replay on their CPU seconds; wall seconds when a rank ran more than one thread),
    the median over the steps every stage kept."""
    pipes = [r.get("pipeline") for r in result.ranks]
    if not pipes or any(p is None or not p.get("chunks_by_step") for p in pipes):
        return None
    col = 2 if result.threads == 1 else 3
    steps = set.intersection(*(set(p["chunks_by_step"]) for p in pipes if p is not None))
    vals = [replay_bubble([[(op[0], int(op[1]), float(op[col]))
                            for op in p["chunks_by_step"][k]] for p in pipes if p is not None])
            for k in sorted(steps)]
    return float(np.median(vals)) if vals else None


def plan_error(result: ParallelResult) -> float | None:
    """Relative error of the planner's total against the busiest rank's measured total."""
    if result.plan is None:
        return None
    measured = max(tracked_bytes(r) for r in result.ranks)
    return (result.plan["total_bytes"] - measured) / measured


@dataclass(frozen=True, kw_only=True)
class Level:
    strategy: str
    nproc: int
    tokens_per_s: float
    vs_ddp_throughput: float | None
    state_bytes_per_rank: int
    """The busiest rank's parameters + optimizer state."""
    vs_ddp_state: float | None
    """state_bytes_per_rank / DDP's at the same process count."""
    target_state: float
    """1/W + 10%: what FSDP and TP should reach."""
    peak_rss_bytes: int
    comm_share: float | None
    comm_ms_by_kind: dict[str, float]
    bubble_measured: float | None
    bubble_theory: float | None
    bubble_replay: float | None
    """The run's own chunk costs replayed with a core per stage and free transfers."""
    bubble_floor: float | None
    """The least bubble p stages can have on this machine's cores (pipeline.bubble_floor)."""
    descheduled_share: float | None
    """Mean over stages: share of the step spent inside a chunk but off the CPU."""
    plan_error: float | None
    peak_rss_planned: int | None
    peak_rss_error: float | None
    final_loss: float


@dataclass(frozen=True, kw_only=True)
class Sweep:
    experiment: str
    levels: list[Level]
    records: list[Record]


def _comm(result: ParallelResult) -> tuple[float | None, dict[str, float]]:
    r0 = result.ranks[0]
    comm, step = r0.get("comm_ms_per_step"), r0.get("profiled_step_ms")
    share = comm / step if comm is not None and step else None
    return share, {k: v["ms"] for k, v in (r0.get("comm") or {}).items()}


def level_of(result: ParallelResult, ddp: ParallelResult | None,
             cores: int | None = None) -> Level:
    """One run against DDP's at the same process count; `cores` (default: this machine's)
    sets the pipeline's bubble floor."""
    busiest = max(result.ranks, key=state_bytes)
    share, kinds = _comm(result)
    pipe = next((r["pipeline"] for r in result.ranks if r.get("pipeline")), None)
    bubbles = [r["pipeline"]["bubble_measured"] for r in result.ranks if r.get("pipeline")]
    ddp_state = max(state_bytes(r) for r in ddp.ranks) if ddp is not None else None
    desched = [r["pipeline"]["descheduled_share"] for r in result.ranks
               if r.get("pipeline") and r["pipeline"].get("descheduled_share") is not None]
    return Level(
        strategy=result.strategy, nproc=result.world, tokens_per_s=result.tokens_per_s,
        vs_ddp_throughput=(result.tokens_per_s / ddp.tokens_per_s) if ddp is not None else None,
        state_bytes_per_rank=state_bytes(busiest),
        vs_ddp_state=state_bytes(busiest) / ddp_state if ddp_state else None,
        target_state=1 / result.world + 0.10,
        peak_rss_bytes=max(int(r["peak_rss_bytes"]) for r in result.ranks),
        comm_share=share, comm_ms_by_kind=kinds,
        bubble_measured=sum(bubbles) / len(bubbles) if bubbles else None,
        bubble_theory=pipe["bubble_theory"] if pipe else None,
        bubble_replay=replayed_bubble(result),
        bubble_floor=(bubble_floor(pipe["stages"], pipe["micro_batches"],
                                   cores or available_cores()) if pipe else None),
        descheduled_share=(float(np.mean(desched)) if desched else None),
        plan_error=plan_error(result),
        peak_rss_planned=(int(result.plan["peak_rss"]["peak_rss_bytes"])
                          if result.plan and "peak_rss" in result.plan else None),
        peak_rss_error=peak_rss_error(result), final_loss=result.losses[-1])


def record_of(result: ParallelResult, level: Level, *, experiment: str, repeat: int = 0) -> Record:
    """One transformer run as a record (stage train.transformer, variable workers)."""
    return make_record(
        experiment=experiment, stage="train.transformer", variable="workers",
        level=result.world, repeat=repeat,
        input_volume=float(result.steps * result.batch * result.seq), input_unit="tokens",
        rate=result.tokens_per_s, rate_unit="tokens/s", wall_s=result.wall_s,
        peak_memory_bytes=level.peak_rss_bytes,
        quality={"final_train_loss": result.losses[-1]},
        recovery="distributed checkpoint + torchrun restart",
        limiting_resource=("communication: gloo" if (level.comm_share or 0) >= 0.5
                           else "cpu compute"),
        series=f"strategy={result.strategy}",
        resources=Resources(comm_share=level.comm_share),
        extras={"strategy": result.strategy,
                "threads": result.threads, "n_params": result.n_params,
                "state_bytes_per_rank": level.state_bytes_per_rank,
                "vs_ddp_state": level.vs_ddp_state, "vs_ddp_throughput": level.vs_ddp_throughput,
                "comm_ms_by_kind": level.comm_ms_by_kind,
                "bubble_measured": level.bubble_measured, "bubble_theory": level.bubble_theory,
                "bubble_replay": level.bubble_replay, "bubble_floor": level.bubble_floor,
                "descheduled_share": level.descheduled_share,
                "peak_rss_planned": level.peak_rss_planned,
                "peak_rss_error": level.peak_rss_error,
                "plan": result.plan, "plan_error": level.plan_error,
                "ranks": result.ranks})


def run_sweep(base: ParallelConfig, *, strategies: list[str], nprocs: list[int],
              experiment: str, timeout_s: float,
              on_level: Callable[[str], None] | None = None) -> Sweep:
    """Every strategy at every process count, plus DDP at each count as the baseline."""
    for s in strategies:
        if s not in STRATEGIES or s == "single":
            raise BadUsageError(f"--strategy {s!r}: sweep dp, fsdp, tp, pp or fsdp+tp")
    if any(n < 2 for n in nprocs):
        raise BadUsageError("--nproc: sweep process counts of 2 or more (DDP at each is the "
                            "baseline)")
    levels, records = [], []
    with tempfile.TemporaryDirectory(prefix="scalelab-tf-bench-") as tmp:
        for n in nprocs:
            ddp: ParallelResult | None = None
            for s in ["dp", *[x for x in strategies if x != "dp"]]:
                cfg = base.replace(strategy=s)
                try:
                    cfg.check_world(n)
                except BadUsageError as e:
                    if on_level is not None:
                        on_level(f"skip {s} x {n}: {e}")
                    continue
                if on_level is not None:
                    on_level(f"{s} x {n}")
                res = run_parallel(cfg, LaunchConfig(nproc=n, timeout_s=timeout_s),
                                   Path(tmp) / f"{s}-{n}")
                if s == "dp":
                    ddp = res
                    if "dp" not in strategies:
                        continue
                lv = level_of(res, ddp)
                levels.append(lv)
                records.append(record_of(res, lv, experiment=experiment))
    return Sweep(experiment=experiment, levels=levels, records=records)
