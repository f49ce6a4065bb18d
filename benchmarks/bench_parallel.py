"""Transformer strategies side by side: memory per rank and throughput against DDP, the
pipeline bubble against theory, the memory planner against what was measured.

Run: .venv/bin/python benchmarks/bench_parallel.py [--quick] [--nproc 2,4] [--bubble-m 4,16]
     [--json OUT]
(~6–10 min on 2 cores: 15 torchrun launches of 20–50 s each; --quick ~4 min.)

Per process count W (2 and 4), on the same Llama-architecture transformer (default 4 layers,
width 256, 4 heads, SwiGLU 512: ~2.8 M parameters), the same global batch and steps:
- DDP (the baseline), FSDP2, tensor parallel (all W ranks), pipeline parallel (GPipe and 1F1B,
  8 micro-batches; GPipe again at each --bubble-m count) and, at W = 4, FSDP × TP (2 × 2); one
  torchrun launch each, 1 thread per process.
- Targets: FSDP and TP hold parameters + optimizer state ≤ 1/W + 10% of DDP's per rank; the
  measured pipeline bubble (mean over stages of 1 − compute / step time) within 5 points of
  (p − 1)/(m + p − 1); the memory planner within 15% of measured peaks — both its tensors
  (`scalelab plan memory`: parameters + gradients + optimizer state + activations, against the
  tensors counted on the busiest rank) and its peak RSS (`plan memory --peak-rss`: those plus
  the process baseline measured on this machine by a probe process, the data and the
  strategy's buffers, against the busiest rank's VmHWM before the profiler starts).
- Beside the bubble, what separates it from theory: `replay` (this run's own chunk CPU times
  replayed with a core per stage and free transfers: the stages' unequal costs), `floor` (the
  least bubble p stages can have on this machine's C cores, 1 − min(m/(m+p−1), C/p)), and
  `off-CPU` (share of the step a stage spent inside a chunk without a core), and the CPU time
  each stage process had, as a share of the step (1.0 with an idle core per stage).
The peer is DDP itself (PyTorch's own data parallel, the project's dependency). Numbers depend on
load: the machine has 2 cores and other work; the script prints the load average beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from scalelab.lab.core.machine import current_machine
from scalelab.system.train.launch import LaunchConfig
from scalelab.system.train.parallel.bench import level_of, plan_error, state_bytes, tracked_bytes
from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.job import ParallelResult, run_parallel


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def runs_for(world: int, bubble_m: list[int]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [("dp", {}), ("fsdp", {}), ("tp", {}),
                                             ("pp", {"schedule": "gpipe"}),
                                             ("pp", {"schedule": "1f1b"})]
    if world == 2:
        # The ablation: torch's schedules posting each receive when they use it.
        out += [("pp", {"schedule": sch, "recv_ahead": False}) for sch in ("gpipe", "1f1b")]
    if world == 4:
        out.append(("fsdp+tp", {"tp": 2}))
    out += [("pp", {"schedule": "gpipe", "micro_batches": m}) for m in bubble_m]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", default="2,4")
    ap.add_argument("--steps", type=int, default=10,
                    help="optimizer steps a run (the bubble is the median of the steps after the "
                         "first, the activation-counting and the 2 profiled ones)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--bubble-m", default="4,16",
                    help="GPipe again at these micro-batch counts (the bubble against m); '' none")
    ap.add_argument("--quick", action="store_true", help="a smaller model, fewer steps")
    ap.add_argument("--json", dest="json_out", default=None, help="write every result here")
    a = ap.parse_args(argv)
    if a.quick:
        a.hidden, a.ffn, a.steps = 128, 256, 4
    base = ParallelConfig.from_flags(
        hidden=a.hidden, layers=a.layers, heads=4, kv_heads=4, ffn=a.ffn, seq=a.seq,
        batch=a.batch, steps=a.steps, tokens=400_000, micro_batches=a.micro_batches,
        profile_steps=2, threads=1)
    m = current_machine()
    print(f"machine: {m.cores} cores, {m.memory_bytes / 2**30:.0f} GiB, {m.device}; "
          f"load average {load()} (shared, busy machine: timings are noisy)")
    print(f"model: {a.layers} layers x width {a.hidden}, 4 heads, SwiGLU {a.ffn}, vocab 257; "
          f"batch {a.batch} x {a.seq} tokens, {a.steps} steps, 1 thread per process")
    everything: list[dict[str, Any]] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        for world in [int(x) for x in a.nproc.split(",")]:
            ddp: ParallelResult | None = None
            bubble_m = [int(x) for x in a.bubble_m.split(",") if x.strip()]
            for strategy, kw in runs_for(world, bubble_m):
                cfg = base.replace(strategy=strategy, **kw)
                name = strategy + (f"/{kw['schedule']}" if "schedule" in kw else "") + (
                    f" m={kw['micro_batches']}" if "micro_batches" in kw else "") + (
                    " torch-recv" if kw.get("recv_ahead") is False else "")
                try:
                    cfg.check_world(world)
                except Exception as e:  # a split this model cannot take is reported, not fatal
                    print(f"  {name} x {world}: skipped ({e})")
                    continue
                before = load()
                res = run_parallel(cfg, LaunchConfig(nproc=world, timeout_s=900),
                                   Path(tmp) / f"{name.replace('/', '-').replace(' ', '')}-{world}",
                                   plan_rss=True)
                if strategy == "dp":
                    ddp = res
                lv = level_of(res, ddp, cores=m.cores)
                busiest = max(res.ranks, key=tracked_bytes)
                rss_growth = max(int(r["peak_rss_bytes"]) - int(r["rss_before_model_bytes"])
                                 for r in res.ranks)
                pe = plan_error(res)
                row = {
                    "strategy": name, "world": world, "tokens_per_s": res.tokens_per_s,
                    "vs_ddp_throughput": lv.vs_ddp_throughput,
                    "state_bytes": state_bytes(max(res.ranks, key=state_bytes)),
                    "vs_ddp_state": lv.vs_ddp_state, "target_state": lv.target_state,
                    "tracked_bytes": tracked_bytes(busiest),
                    "plan_bytes": res.plan["total_bytes"] if res.plan else None,
                    "plan_error": pe, "rss_growth_bytes": rss_growth,
                    "peak_rss_bytes": lv.peak_rss_bytes, "comm_share": lv.comm_share,
                    "comm_ms": lv.comm_ms_by_kind, "bubble": lv.bubble_measured,
                    "bubble_theory": lv.bubble_theory, "bubble_replay": lv.bubble_replay,
                    "bubble_floor": lv.bubble_floor, "descheduled": lv.descheduled_share,
                    "process_cpu_share": _cpu_share(res),
                    "micro_batches": cfg.parallel.micro_batches,
                    "peak_rss_planned": lv.peak_rss_planned, "peak_rss_error": lv.peak_rss_error,
                    "rss_baseline": (res.plan or {}).get("peak_rss", {}).get("runtime_bytes"),
                    "malloc_free_at_peak": _malloc_at_peak(res),
                    "load": f"{before} -> {load()}",
                    "final_loss": res.losses[-1],
                }
                rows.append(row)
                everything.append({**row, "result": dataclasses.asdict(res)})
                print(_line(row), flush=True)
    print()
    print("| strategy | W | tokens/s | vs DDP | params+optim per rank | vs DDP | target | "
          "planned vs measured (params+grads+optim+act) | planned vs measured peak RSS | "
          "comm share | bubble (theory; replay; floor; off-CPU) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_md(r))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(everything, indent=2, default=str) + "\n",
                                    encoding="utf-8")
    print(f"load average at the end: {load()}")
    return 0


def _cpu_share(res: ParallelResult) -> float | None:
    """Mean over stages of the process's CPU time / the step's wall time: how much of a core
    each stage had (1.0 on an idle machine with a core per stage)."""
    shares = [r["pipeline"]["process_cpu_share"] for r in res.ranks
              if r.get("pipeline") and r["pipeline"].get("process_cpu_share") is not None]
    return sum(shares) / len(shares) if shares else None


def _malloc_at_peak(res: ParallelResult) -> int | None:
    """Bytes malloc held free at the busiest rank's highest pre-profiler timeline point."""
    busiest = max(res.ranks, key=lambda r: int(r["peak_rss_bytes"]))
    points = [p for p in busiest.get("rss_timeline") or []
              if "profiled" not in p[0] and p[2] is not None and len(p) > 3]
    if not points:
        return None
    top = max(points, key=lambda p: p[2])
    return None if top[3] is None else int(top[3])


def _fmt_mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _line(r: dict[str, Any]) -> str:
    parts = [f"{r['strategy']:>12} x {r['world']}: {r['tokens_per_s']:8,.0f} tokens/s"]
    if r["vs_ddp_throughput"] is not None:
        parts.append(f"{r['vs_ddp_throughput']:.2f}x DDP")
    parts.append(f"params+optim {_fmt_mib(r['state_bytes'])}/rank")
    if r["vs_ddp_state"] is not None:
        ok = "" if r["strategy"] not in ("fsdp", "tp") else (
            " OK" if r["vs_ddp_state"] <= r["target_state"] else " MISSED")
        parts.append(f"= {r['vs_ddp_state']:.3f} of DDP (target <= {r['target_state']:.3f}"
                     f"{ok})")
    if r["plan_error"] is not None:
        parts.append(f"plan {_fmt_mib(r['plan_bytes'])} vs measured "
                     f"{_fmt_mib(r['tracked_bytes'])} ({r['plan_error']:+.1%}"
                     f"{' OK' if abs(r['plan_error']) <= 0.15 else ' MISSED'}); "
                     f"RSS grew {_fmt_mib(r['rss_growth_bytes'])}")
    if r["peak_rss_error"] is not None:
        free = ("" if r["malloc_free_at_peak"] is None else
                f", malloc free after that step {_fmt_mib(r['malloc_free_at_peak'])}")
        parts.append(f"peak RSS planned {_fmt_mib(r['peak_rss_planned'])} (baseline "
                     f"{_fmt_mib(r['rss_baseline'])}) vs measured {_fmt_mib(r['peak_rss_bytes'])}"
                     f" ({r['peak_rss_error']:+.1%}"
                     f"{' OK' if abs(r['peak_rss_error']) <= 0.15 else ' MISSED'}{free})")
    if r["comm_share"] is not None:
        parts.append(f"comm {r['comm_share']:.0%} "
                     + ", ".join(f"{k} {v:.0f} ms" for k, v in r["comm_ms"].items()))
    if r["bubble"] is not None:
        gap = 100 * (r["bubble"] - r["bubble_theory"])
        parts.append(f"bubble {r['bubble']:.1%} vs theory {r['bubble_theory']:.1%} "
                     f"({gap:+.1f} points{' OK' if abs(gap) <= 5 else ' MISSED'}); "
                     f"replay {_pct(r['bubble_replay'])}, floor on this machine "
                     f"{_pct(r['bubble_floor'])}, off-CPU {_pct(r['descheduled'])}, CPU per stage "
                     f"{_pct(r['process_cpu_share'])} of the step")
    parts.append(f"load {r['load']}")
    return "; ".join(parts)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _md(r: dict[str, Any]) -> str:
    vs_t = "–" if r["vs_ddp_throughput"] is None else f"{r['vs_ddp_throughput']:.2f}×"
    vs_s = "–" if r["vs_ddp_state"] is None else f"{r['vs_ddp_state']:.3f}"
    target = f"≤ {r['target_state']:.3f}" if r["strategy"] in ("fsdp", "tp") else ""
    plan = ("–" if r["plan_error"] is None else
            f"{_fmt_mib(r['plan_bytes'])} vs {_fmt_mib(r['tracked_bytes'])} "
            f"({r['plan_error']:+.1%})")
    rss = ("–" if r["peak_rss_error"] is None else
           f"{_fmt_mib(r['peak_rss_planned'])} vs {_fmt_mib(r['peak_rss_bytes'])} "
           f"({r['peak_rss_error']:+.1%})")
    comm = "–" if r["comm_share"] is None else f"{r['comm_share']:.0%}"
    bubble = ("" if r["bubble"] is None else
              f"{r['bubble']:.1%} ({r['bubble_theory']:.1%}; {_pct(r['bubble_replay'])}; "
              f"{_pct(r['bubble_floor'])}; {_pct(r['descheduled'])})")
    return (f"| {r['strategy']} | {r['world']} | {r['tokens_per_s']:,.0f} | {vs_t} | "
            f"{_fmt_mib(r['state_bytes'])} | {vs_s} | {target} | {plan} | {rss} | {comm} | "
            f"{bubble} |")


if __name__ == "__main__":
    sys.exit(main())
