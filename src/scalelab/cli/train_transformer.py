"""`scalelab train --model transformer ...` and `scalelab train bench --model transformer ...`.

The transformer's options are added to the `train` group and its `bench` command by two
decorators; cli/train.py hands over to `run_transformer` / `run_transformer_bench` when
`--model transformer` is given. Options the flights trainer also has keep their meaning where
it carries over (--nproc, --steps, --seed, --lr, --checkpoint-interval, --rehearse-failure, ...);
--batch counts sequences and, left at its default, means 8; --hidden is one width (default 64).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, err_console, parse_list, stacked
from scalelab.cli._progress import live_progress
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import format_bytes, format_duration, parse_duration
from scalelab.system.train.parallel.config import STRATEGIES

TRANSFORMER_KEYS = ("model", "strategy", "tp", "layers", "heads", "kv_heads", "ffn", "seq",
                    "tokens", "micro_batches", "schedule", "recv_ahead", "profile_steps")
DEFAULT_BATCH = 8
DEFAULT_HIDDEN = 64


def transformer_options(*, sweep: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        opts = [
            click.option("--model", type=click.Choice(["flights", "transformer"]),
                         default="flights", show_default=True,
                         help="flights: the tabular delay model; transformer: the Llama "
                              "network on the stdlib sources (see docs/parallel.md)."),
            click.option("--strategy", default="dp,fsdp,tp,pp" if sweep else "dp",
                         show_default=True,
                         help=("Transformer strategies to sweep, e.g. dp,fsdp,tp,pp,fsdp+tp."
                               if sweep else "Transformer: single, dp, fsdp, tp, pp or "
                                             "fsdp+tp.")),
            click.option("--tp", type=int, default=2, show_default=True,
                         help="Transformer: tensor-parallel degree for fsdp+tp."),
            click.option("--layers", type=int, default=4, show_default=True,
                         help="Transformer blocks."),
            click.option("--heads", type=int, default=4, show_default=True),
            click.option("--kv-heads", type=int, default=4, show_default=True),
            click.option("--ffn", type=int, default=128, show_default=True,
                         help="Transformer: SwiGLU inner width."),
            click.option("--seq", type=int, default=64, show_default=True,
                         help="Transformer: tokens per sequence."),
            click.option("--tokens", type=int, default=200_000, show_default=True,
                         help="Transformer: corpus tokens to read (stdlib sources, bytes)."),
            click.option("--micro-batches", type=int, default=4, show_default=True,
                         help="Transformer, pipeline: micro-batches per step."),
            click.option("--schedule", type=click.Choice(["gpipe", "1f1b"]), default="1f1b",
                         show_default=True, help="Transformer, pipeline: schedule."),
            click.option("--recv-ahead/--no-recv-ahead", default=True, show_default=True,
                         help="Transformer, pipeline: post each step's receives ahead of need "
                              "(--no-recv-ahead: when torch's schedule uses them)."),
            click.option("--profile-steps", type=int, default=2, show_default=True,
                         help="Transformer: steps timed under torch.profiler for the "
                              "communication split."),
        ]
        return stacked(opts)(f)
    return deco


def split_options(ctx: click.Context, common: dict[str, Any]) -> dict[str, Any]:
    """Take the transformer's options out of `common`; refuse them without --model transformer."""
    t = {k: common.pop(k) for k in TRANSFORMER_KEYS if k in common}
    if t.get("model") != "transformer":
        given = [k for k in TRANSFORMER_KEYS if k != "model"
                 and ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)]
        if given:
            raise BadUsageError(f"--{given[0].replace('_', '-')} is a transformer option; "
                                "add --model transformer")
    return t


def _width(ctx: click.Context, hidden: str) -> int:
    if ctx.get_parameter_source("hidden") == ParameterSource.DEFAULT:
        return DEFAULT_HIDDEN
    w = parse_list(hidden, what="--hidden", kind=int)
    if len(w) != 1:
        raise BadUsageError(f"--hidden {hidden!r}: the transformer takes one width, e.g. 128")
    return int(w[0])


def _defaulted(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == ParameterSource.DEFAULT


def _config(ctx: click.Context, t: dict[str, Any], *, batch: int, steps: int, seed: int,
            lr: float, hidden: str, threads: int | None, batch_param: str = "batch",
            **extra: Any) -> Any:
    from scalelab.system.train.parallel.config import ParallelConfig

    if _defaulted(ctx, batch_param):
        batch = DEFAULT_BATCH
    return ParallelConfig.from_flags(
        strategy=t["strategy"], tp=t["tp"], hidden=_width(ctx, hidden), layers=t["layers"],
        heads=t["heads"], kv_heads=t["kv_heads"], ffn=t["ffn"], seq=t["seq"],
        tokens=t["tokens"], batch=batch, steps=steps, lr=lr, seed=seed,
        micro_batches=t["micro_batches"], schedule=t["schedule"], recv_ahead=t["recv_ahead"],
        profile_steps=t["profile_steps"], threads=threads, **extra)


def _rank_rows(t: Table, r: Any) -> None:
    for rk in r.ranks:
        t.add_row(f"rank {rk['rank']} params / grads / optimizer / activations",
                  f"{format_bytes(rk['param_bytes'])} / {format_bytes(rk['grad_bytes'])} / "
                  f"{format_bytes(rk['optimizer_bytes'])} / "
                  f"{format_bytes(rk['activation_bytes'])}")
        t.add_row(f"rank {rk['rank']} peak RSS", format_bytes(rk["peak_rss_bytes"]))
        if rk.get("compute_ms_per_step") is not None:
            kinds = ", ".join(
                f"{k} {v['ms']:.1f} ms ({format_bytes(v['bytes'])}"
                + (f", {v['bandwidth_bytes_per_s'] / 1e6:.1f} MB/s)"
                   if v["bandwidth_bytes_per_s"] else ")")
                for k, v in rk["comm"].items())
            t.add_row(f"rank {rk['rank']} compute / comm ms per step",
                      f"{rk['compute_ms_per_step']:.1f} / {rk['comm_ms_per_step']:.1f}"
                      + (f": {kinds}" if kinds else ""))
        if rk.get("pipeline"):
            p = rk["pipeline"]
            t.add_row(f"rank {rk['rank']} bubble ({p['schedule']}, m={p['micro_batches']})",
                      f"{p['bubble_measured']:.1%} measured, {p['bubble_theory']:.1%} theory"
                      + (f"; off the CPU {p['descheduled_share']:.1%} of the step"
                         if p.get("descheduled_share") is not None else ""))


def _render(r: Any, rehearsal: Any) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        t = Table(title=f"transformer: {r.strategy} over {r.world} process(es) x {r.threads} "
                        "thread(s)")
        t.add_column("what")
        t.add_column("value", justify="right")
        t.add_row("parameters / corpus", f"{r.n_params:,} / {r.corpus['tokens']:,} tokens "
                  f"({r.corpus['files']} stdlib files)")
        t.add_row("steps x batch x seq", f"{r.steps} x {r.batch} x {r.seq}")
        t.add_row("tokens/s", f"{r.tokens_per_s:,.0f} (median step "
                  f"{format_duration(r.median_step_s)})")
        t.add_row("loss first → last", f"{r.losses[0]:.4f} → {r.losses[-1]:.4f}")
        _rank_rows(t, r)
        if r.plan is not None:
            t.add_row("planned per rank (plan memory)", format_bytes(r.plan["total_bytes"]))
        if rehearsal is not None:
            t.add_row("failure", f"rank {rehearsal.killed_rank} killed at step "
                      f"{rehearsal.killed_at_step}")
            t.add_row("recovery", f"resumed from step {rehearsal.resumed_from_step}, "
                      f"{format_duration(rehearsal.recovery_s or 0.0)} to the next step")
            t.add_row("equals uninterrupted run", "bitwise" if rehearsal.bitwise_equal
                      else f"no (max |diff| {rehearsal.max_abs_diff:.3g})")
        c.print(t)
    return render


def run_transformer(ctx: click.Context, t: dict[str, Any], *, as_json: bool, nproc: int,
                    nnodes: str, rdzv_endpoint: str | None, rdzv_id: str | None,
                    max_restarts: int, device: str, timeout: str, run_dir: str | None,
                    records: str | None, checkpoint_dir: str | None,
                    checkpoint_interval: str | None, rehearse_failure: bool, no_resume: bool,
                    nondeterministic: bool, batch: int, steps: int | None, seed: int, lr: float,
                    hidden: str, threads: int | None) -> None:
    from scalelab.system.train.launch import LaunchConfig, run_directory
    from scalelab.system.train.parallel.job import rehearse, run_parallel

    every = 0
    if checkpoint_interval is not None:
        if not checkpoint_interval.strip().isdigit():
            raise BadUsageError(f"--checkpoint-interval {checkpoint_interval!r}: the "
                                "transformer takes a step count (e.g. 5)")
        every = int(checkpoint_interval)
    cfg = _config(ctx, t, batch=batch, steps=steps or 20, seed=seed, lr=lr, hidden=hidden,
                  threads=threads, checkpoint_every=every, checkpoint_dir=checkpoint_dir,
                  resume=not no_resume, deterministic=not nondeterministic)
    lc = LaunchConfig(nproc=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                      max_restarts=max_restarts, cuda=device == "cuda",
                      timeout_s=parse_duration(timeout, what="--timeout"), run_dir=run_dir)
    with run_directory(run_dir) as rd:
        rehearsal = None
        if rehearse_failure:
            if not every:
                cfg = cfg.replace(checkpoint_every=max(1, cfg.steps // 4))
            rehearsal = rehearse(cfg, lc, Path(rd))
            result = rehearsal.result
        else:
            with live_progress(f"train {cfg.parallel.strategy} on {nproc} process(es)") as progress:
                result = run_parallel(cfg, lc, Path(rd), on_progress=lambda step, total, loss:
                                      progress.update(completed=step, total=total,
                                                      note=f"train: step {step}/{total}, "
                                                           f"loss {loss:.4f}"))
    if result.warning:
        err_console.print(f"[yellow]warning:[/] {result.warning}", markup=True, highlight=False)
    if records:
        from scalelab.lab.core.records import append_records, new_experiment_id
        from scalelab.system.train.parallel.bench import level_of, record_of

        append_records(records, [record_of(result, level_of(result, None),
                                           experiment=new_experiment_id("train-transformer"))])
    doc: dict[str, Any] = {**vars(result)}
    if rehearsal is not None:
        doc["rehearsal"] = {k: v for k, v in vars(rehearsal).items()
                            if k not in ("result", "reference")}
        doc["rehearsal"]["reference_losses"] = rehearsal.reference.losses
    emit(doc, as_json, _render(result, rehearsal))


def _render_sweep(sw: Any) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        t = Table(title="transformer strategies vs DDP at the same process count")
        for col in ("strategy", "procs", "tokens/s", "vs DDP", "params+optim /rank", "vs DDP",
                    "target", "peak RSS", "comm share", "bubble (theory)", "plan error"):
            t.add_column(col, justify="right")
        for lv in sw.levels:
            t.add_row(lv.strategy, str(lv.nproc), f"{lv.tokens_per_s:,.0f}",
                      "–" if lv.vs_ddp_throughput is None else f"{lv.vs_ddp_throughput:.2f}×",
                      format_bytes(lv.state_bytes_per_rank),
                      "–" if lv.vs_ddp_state is None else f"{lv.vs_ddp_state:.3f}",
                      f"≤ {lv.target_state:.3f}" if lv.strategy in ("fsdp", "tp") else "",
                      format_bytes(lv.peak_rss_bytes),
                      "–" if lv.comm_share is None else f"{lv.comm_share:.0%}",
                      "" if lv.bubble_measured is None
                      else f"{lv.bubble_measured:.1%} ({lv.bubble_theory:.1%})",
                      "–" if lv.plan_error is None else f"{lv.plan_error:+.1%}")
        c.print(t)
        c.print(f"experiment {sw.experiment}: {len(sw.records)} records")
    return render


def run_transformer_bench(ctx: click.Context, t: dict[str, Any], *, as_json: bool, nprocs: str,
                          batches: str, steps: int, seed: int, lr: float, hidden: str,
                          threads: int | None, timeout: str, records: str | None) -> None:
    from scalelab.lab.core.records import append_records, new_experiment_id
    from scalelab.system.train.parallel.bench import run_sweep

    strategies = [s.strip() for s in str(t["strategy"]).split(",") if s.strip()]
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise BadUsageError(f"--strategy {bad[0]!r}: choose from {', '.join(STRATEGIES[1:])}")
    batch = parse_list(batches, what="--batch", kind=int)[0]
    # The flights sweep's defaults (1,2,4 processes, 40 steps) do not fit here: DDP at each
    # count is the baseline, and a transformer step costs far more.
    if _defaulted(ctx, "nprocs"):
        nprocs = "2,4"
    if _defaulted(ctx, "steps"):
        steps = 6
    # The sweep sets each level's strategy; the base config carries DDP's.
    cfg = _config(ctx, {**t, "strategy": "dp"}, batch=batch, steps=steps, seed=seed, lr=lr,
                  hidden=hidden, threads=threads or 1, batch_param="batches")
    sw = run_sweep(cfg, strategies=strategies, nprocs=parse_list(nprocs, what="--nproc", kind=int),
                   experiment=new_experiment_id("train-transformer-bench"),
                   timeout_s=parse_duration(timeout, what="--timeout"),
                   on_level=lambda m: err_console.print(f"[dim]running {m}[/]", markup=True))
    if records:
        append_records(records, sw.records)
    emit({"experiment": sw.experiment, "levels": sw.levels, "records_file": records,
          "records": len(sw.records)}, as_json, _render_sweep(sw))
