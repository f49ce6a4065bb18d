"""The worker sweep: one training run per process count, as records, with the scaling verdict.

Each level is a real torchrun launch with the same data and step count. Strong mode keeps the
global batch (speedup = how much sooner the same work finishes); weak mode keeps the per-worker
batch (scaled speedup). Efficiency is throughput(n) / (n * throughput(1)); Karp–Flatt's serial
fraction rising with n means overhead (communication, contention) rather than a fixed serial
phase. Threads per process are held fixed (default 1) so the worker count is the only
variable. The limiting resource is named per level: oversubscribed cores first (processes x
threads > cores), then communication when the all-reduce takes half the step or more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.laws import karp_flatt
from scalelab.lab.core.machine import available_cores
from scalelab.lab.core.records import Cost, Record, make_record
from scalelab.lab.core.signals import Resources
from scalelab.lab.core.usage import Usage, UsageMeter
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.job import TrainResult, run_training
from scalelab.system.train.launch import LaunchConfig

COMM_DOMINATES = 0.5


def limiting_resource(*, world: int, threads: int, cores: int, comm_share: float) -> str:
    if world * threads > cores:
        return f"cpu: {cores} cores"
    if comm_share >= COMM_DOMINATES:
        return "communication: gloo all-reduce"
    if world * threads == cores:
        return f"cpu: {cores} cores"
    return "cpu compute"


def run_record(result: TrainResult, *, experiment: str, variable: str, level: float,
               repeat: int = 0, extras: dict[str, Any] | None = None,
               usage: Usage | None = None, price_per_core_hour: float | None = None) -> Record:
    """One training run as a foundation record (stage 'train').

    With `usage` (the run's measured CPU time) and a core-hour price, the cost is those
    CPU-seconds at that price: per run (extras) and per million samples; otherwise the
    machine's price per hour over the run's wall time, when configured."""
    s, e = result.summary, result.evaluation
    cost = None
    samples = float(s.steps * s.global_batch)
    if usage is not None and price_per_core_hour is not None and samples > 0:
        usd = usage.cpu_s / 3600.0 * price_per_core_hour
        cost = Cost(usd=usd, per_unit_usd=usd / samples * 1e6, unit="1M training samples")
    elif s.rate.samples_per_usd:
        usd = s.train_wall_s * s.rate.samples_per_s / s.rate.samples_per_usd
        cost = Cost(usd=usd, per_unit_usd=1e6 / s.rate.samples_per_usd,
                    unit="1M training samples")
    return make_record(
        experiment=experiment, stage="train", variable=variable, level=level, repeat=repeat,
        input_volume=samples, input_unit="samples",
        rate=s.rate.samples_per_s, rate_unit="samples/s", wall_s=s.train_wall_s,
        peak_memory_bytes=max(m.peak_rss_bytes for m in s.memory),
        quality={"final_train_loss": s.final_loss, "test_loss": e.loss,
                 "accuracy": e.accuracy, "macro_f1": e.macro_f1, "ece": e.ece},
        cost=cost,
        recovery=("checkpoint + torchrun restart" if s.checkpoint
                  else "torchrun restart (no checkpoints)"),
        resources=(usage.resources(comm_share=s.comm_share) if usage is not None
                   else Resources(comm_share=s.comm_share)),
        extras={"world": s.world, "threads": s.threads, "global_batch": s.global_batch,
                "local_batch": s.local_batch, "phase_ms_per_step": s.phase_ms_per_step,
                "flops_per_s": s.rate.flops_per_s,
                "mfu": s.rate.mfu, "optimizer_state_bytes": [m.optimizer_state_bytes
                                                              for m in s.memory],
                **(usage.extras() if usage is not None else {}),
                **({"cost_per_run_usd": cost.usd} if cost is not None else {}),
                **(extras or {})},
    )


@dataclass(frozen=True, kw_only=True)
class Level:
    nproc: int
    threads: int
    global_batch: int
    samples_per_s: float
    speedup: float
    efficiency: float
    karp_flatt: float | None
    comm_share: float
    phase_ms_per_step: dict[str, float]
    limiting_resource: str


@dataclass(frozen=True, kw_only=True)
class Sweep:
    mode: str
    batch: int
    levels: list[Level]
    usl: dict[str, Any] | None
    peak_nproc: int
    verdict: str


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    experiment: str
    sweeps: list[Sweep]
    records: list[Record]


def _usl(levels: list[Level]) -> dict[str, Any] | None:
    if len({lv.nproc for lv in levels}) < 3:
        return None
    try:
        from scalelab.lab.core.usl import fit_usl
    except ImportError:
        return None
    f = fit_usl([lv.nproc for lv in levels], [lv.samples_per_s for lv in levels])
    return {"alpha": f.alpha.value, "beta": f.beta.value, "gamma": f.gamma.value,
            "n_peak": f.n_peak, "x_peak": f.x_peak}


def _verdict(levels: list[Level], mode: str) -> tuple[int, str]:
    peak = max(levels, key=lambda lv: lv.samples_per_s)
    last = levels[-1]
    text = (f"{mode} scaling peaks at {peak.nproc} process(es) "
            f"({peak.samples_per_s:,.0f} samples/s, efficiency {peak.efficiency:.0%})")
    beyond = [lv for lv in levels if lv.nproc > peak.nproc]
    if beyond:
        text += f"; beyond it the limit is {beyond[0].limiting_resource}"
    elif last.efficiency < 0.85 and len(levels) > 1:
        text += f"; efficiency is limited by {last.limiting_resource}"
    return peak.nproc, text


def _level(n: int, r: TrainResult, x1: float, cores: int) -> Level:
    s = r.summary
    speedup = s.rate.samples_per_s / x1 if x1 else 0.0
    return Level(
        nproc=n, threads=s.threads, global_batch=s.global_batch,
        samples_per_s=s.rate.samples_per_s, speedup=speedup, efficiency=speedup / n,
        karp_flatt=karp_flatt(speedup, n) if n > 1 and speedup > 0 else None,
        comm_share=s.comm_share, phase_ms_per_step=s.phase_ms_per_step,
        limiting_resource=limiting_resource(world=n, threads=s.threads, cores=cores,
                                            comm_share=s.comm_share))


def run_bench(base: TabularRunConfig, *, nprocs: list[int], batches: list[int], experiment: str,
              timeout_s: float, on_level: Callable[[str], None] | None = None,
              on_warning: Callable[[str], None] | None = None,
              on_record: Callable[[Record], None] | None = None,
              price_per_core_hour: float | None = None) -> BenchResult:
    """The sweep. `on_record` gets each worker count's record as soon as it is measured (the
    CLI appends it to --records), so a bench stopped later (diagnose's deadline, Ctrl-C)
    keeps the counts it measured; a record's `usl` is the fit over the counts measured up to
    it (None under three)."""
    if sorted(set(nprocs)) != sorted(nprocs) or any(n < 1 for n in nprocs):
        raise BadUsageError("--nproc must list distinct process counts >= 1, e.g. 1,2,4")
    if 1 not in nprocs:
        raise BadUsageError("--nproc must include 1: efficiency is measured against one process")
    nprocs = sorted(nprocs)
    cores = available_cores()
    sweeps, records = [], []
    for batch in batches:
        # One variable at a time: threads per process stay fixed (default 1), so the worker
        # count is all that changes. With cores // n threads instead, the 1-process baseline
        # runs multi-threaded, and on a shared machine its intra-op threads stall each other
        # (8-11x slower here under load), which makes every later level look superlinear.
        cfg = dataclasses.replace(base, batch=batch, checkpoint_every=0, checkpoint_auto=False,
                                  rehearse_failure=False, threads=base.threads or 1)
        exp = experiment if len(batches) == 1 else f"{experiment}-b{batch}"
        levels: list[Level] = []
        usl: dict[str, Any] | None = None
        for n in nprocs:
            if on_level is not None:
                on_level(f"batch {batch}, {n} process(es)")
            # The torchrun tree is waited for, so its CPU time is in RUSAGE_CHILDREN.
            with UsageMeter() as meter:
                r = run_training(cfg, LaunchConfig(nproc=n, timeout_s=timeout_s),
                                 on_warning=on_warning)
            x1 = levels[0].samples_per_s if levels else r.summary.rate.samples_per_s
            lv = _level(n, r, x1, cores)
            levels.append(lv)
            usl = _usl(levels)
            rec = run_record(
                r, experiment=exp, variable="workers", level=lv.nproc,
                usage=meter.usage, price_per_core_hour=price_per_core_hour,
                extras={"mode": cfg.mode, "batch": batch, "speedup": lv.speedup,
                        "efficiency": lv.efficiency, "karp_flatt": lv.karp_flatt, "usl": usl})
            records.append(rec)
            if on_record is not None:
                on_record(rec)
        peak, verdict = _verdict(levels, cfg.mode)
        sweeps.append(Sweep(mode=cfg.mode, batch=batch, levels=levels, usl=usl,
                            peak_nproc=peak, verdict=verdict))
    return BenchResult(experiment=experiment, sweeps=sweeps, records=records)
