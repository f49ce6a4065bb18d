"""`scalelab train ...`: train under torchrun, sweep worker counts, fit a compute-optimal law.

`scalelab train --nproc 2 ...` trains (the group runs training when no subcommand is given);
`scalelab train bench ...` sweeps worker counts; `scalelab train scaling-law ...` fits L(N, D).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, err_console, json_option, parse_list, stacked
from scalelab.cli._prices import prices_option, resolve_prices
from scalelab.cli._progress import live_progress
from scalelab.cli.train_transformer import (
    run_transformer,
    run_transformer_bench,
    split_options,
    transformer_options,
)
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import format_bytes, format_duration, parse_duration
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.job import TrainResult, run_training
from scalelab.system.train.launch import LaunchConfig


def _warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", markup=True, highlight=False)


def _interval(text: str | None) -> tuple[int, bool]:
    if text is None:
        return 0, False
    if text.strip().lower() == "auto":
        return 0, True
    if not text.strip().isdigit():
        raise BadUsageError(f"--checkpoint-interval {text!r}: give a step count (e.g. 50) or auto")
    return int(text), False


def _float_or_none(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise BadUsageError(f"{what} {text!r} is not a number") from None


def _si(text: str | None, what: str) -> float | None:
    """'1.2T' -> 1.2e12 (FLOP/s); k, M, G, T, P suffixes."""
    if text is None:
        return None
    t = text.strip()
    mult = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}.get(t[-1:].lower())
    value = _float_or_none(t[:-1] if mult else t, what)
    return None if value is None else value * (mult or 1.0)


def common_train_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options every training command shares (data, model, batch policy, launch)."""
    opts = [
        click.option("--data", type=click.Path(file_okay=False), default=None,
                     help="Dataset dir with train.parquet/test.parquet "
                          "(default: the raw flights CSV)."),
        click.option("--limit", default=None,
                     help="Training rows (e.g. 20000) or a fraction (e.g. 0.1); "
                          "the test split shrinks alike."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--mode", type=click.Choice(["strong", "weak"]), default="strong",
                     show_default=True, help="strong: fixed global batch; weak: fixed per worker."),
        click.option("--accumulation", type=int, default=1, show_default=True,
                     help="Micro-steps per optimizer step (no_sync on all but the last)."),
        click.option("--lr", type=float, default=2e-3, show_default=True,
                     help="Learning rate at --base-batch (scaled linearly with the global batch)."),
        click.option("--base-batch", type=int, default=512, show_default=True),
        click.option("--warmup", type=int, default=None,
                     help="Warmup steps (default: 0 at the base batch, else 5% of the steps)."),
        click.option("--hidden", default="64,64", show_default=True, help="Hidden layer widths."),
        click.option("--class-weights", type=click.Choice(["balanced", "none"]), default="balanced",
                     show_default=True,
                     help="balanced: weight each class's loss inversely to its frequency."),
        click.option("--shard", type=click.Choice(["none", "zero", "fsdp"]), default="none",
                     show_default=True, help="zero: ZeroRedundancyOptimizer; fsdp: FSDP2."),
        click.option("--threads", type=int, default=None,
                     help="Threads per process (default: cores // processes)."),
        click.option("--timeout", "timeout", default="10m", show_default=True,
                     help="Bound on each torchrun run; its processes are killed on expiry."),
        click.option("--peak-flops", default=None,
                     help="Device peak FLOP/s per process, e.g. 1.2T (for MFU)."),
        click.option("--price-per-hour", type=float, default=None,
                     help="Machine cost in USD/hour, for samples per dollar."),
    ]
    return stacked(opts)(f)


def build_config(*, data: str | None, limit: str | None, seed: int, batch: int, mode: str,
                 accumulation: int, lr: float, base_batch: int, warmup: int | None, hidden: str,
                 class_weights: str, shard: str, threads: int | None, peak_flops: str | None,
                 price_per_hour: float | None, **extra: Any) -> TabularRunConfig:
    return TabularRunConfig(
        data=data, limit=_float_or_none(limit, "--limit"), seed=seed, batch=batch,
        mode=mode,  # type: ignore[arg-type]
        accumulation=accumulation, lr=lr, base_batch=base_batch, warmup_steps=warmup,
        hidden=parse_list(hidden, what="--hidden", kind=int),
        class_weights="none" if class_weights == "none" else "balanced",
        shard=shard,  # type: ignore[arg-type]
        threads=threads, peak_flops=_si(peak_flops, "--peak-flops"),
        price_per_hour=price_per_hour, **extra)


def _render(r: TrainResult) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        s, e = r.summary, r.evaluation
        t = Table(title=f"training: {s.world} process(es) x {s.threads} thread(s), {s.backend}")
        t.add_column("what")
        t.add_column("value", justify="right")
        ran = "" if s.steps == s.total_steps else f" ({s.steps} in the last attempt)"
        t.add_row("steps x global batch", f"{s.total_steps} x {s.global_batch}{ran}, "
                  f"local {s.local_batch}, accumulation {s.accumulation}")
        t.add_row("peak lr / warmup", f"{s.peak_lr:.3g} / {s.warmup_steps} steps")
        t.add_row("samples/s", f"{s.rate.samples_per_s:,.0f}")
        for k, v in s.phase_ms_per_step.items():
            t.add_row(f"  {k} ms/step", f"{v:.2f}")
        t.add_row("communication share", f"{s.comm_share:.0%}")
        if s.rate.flops_per_s is not None:
            t.add_row("achieved FLOP/s", f"{s.rate.flops_per_s:.3g}")
        if s.rate.mfu is not None:
            t.add_row("MFU", f"{s.rate.mfu:.2%}")
        if s.rate.samples_per_usd is not None:
            t.add_row("samples per USD", f"{s.rate.samples_per_usd:,.0f}")
        for m in s.memory:
            t.add_row(f"rank {m.rank} peak RSS / optimizer state",
                      f"{format_bytes(m.peak_rss_bytes)} / {format_bytes(m.optimizer_state_bytes)}")
        t.add_row("final train loss", f"{s.final_loss:.4f}")
        t.add_row("test loss / accuracy / macro F1",
                  f"{e.loss:.4f} / {e.accuracy:.3f} / {e.macro_f1:.3f}")
        t.add_row("calibration (ECE)", f"{e.ece:.4f}")
        if s.checkpoint is not None:
            ck = s.checkpoint
            t.add_row("checkpoints", f"{ck.saves} every {ck.interval_steps} steps"
                      f"{' (Daly)' if ck.auto else ''}, blocking {ck.blocking_share:.2%} of "
                      f"training{' (async)' if ck.asynchronous else ''}")
        if s.recovery is not None:
            rc = s.recovery
            t.add_row("failure", f"rank {rc.failed_rank} killed at step {rc.failed_step}")
            t.add_row("recovery", f"resumed from step {rc.resumed_from_step}, "
                      f"{rc.redone_steps} steps redone, "
                      f"{format_duration(rc.recovery_s or 0.0)} to the next step")
        if r.rehearsal is not None:
            t.add_row("equals uninterrupted run",
                      "bitwise" if r.rehearsal.bitwise_equal
                      else f"no (max |diff| {r.rehearsal.max_abs_diff:.3g})")
        if r.model_dir:
            t.add_row("model", r.model_dir)
        c.print(t)
        pc = Table(title="held-out per class")
        for col in ("class", "support", "precision", "recall", "F1"):
            pc.add_column(col, justify="right")
        for cs in e.per_class:
            pc.add_row(cs.name, str(cs.support), f"{cs.precision:.3f}", f"{cs.recall:.3f}",
                       f"{cs.f1:.3f}")
        c.print(pc)
    return render


@click.group(invoke_without_command=True)
@common_train_options
@transformer_options(sweep=False)
@click.option("--batch", type=int, default=512, show_default=True,
              help="Global batch (strong mode) or per-worker batch (weak mode).")
@click.option("--epochs", type=int, default=1, show_default=True)
@click.option("--steps", type=int, default=None, help="Stop after this many optimizer steps.")
@click.option("--nproc", type=int, default=1, show_default=True, help="Worker processes.")
@click.option("--nnodes", default="1", show_default=True, help="Nodes, or MIN:MAX (elastic).")
@click.option("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (multi-node).")
@click.option("--rdzv-id", default=None, help="Job id shared by all nodes of the run.")
@click.option("--max-restarts", type=int, default=0, show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None)
@click.option("--checkpoint-interval", default=None, help="Steps between checkpoints, or auto.")
@click.option("--mtbf", default="6h", show_default=True,
              help="Mean time between failures for --checkpoint-interval auto.")
@click.option("--keep", type=int, default=3, show_default=True, help="Checkpoints kept.")
@click.option("--async-checkpoint", is_flag=True, help="Write checkpoints in the background.")
@click.option("--no-resume", is_flag=True, help="Ignore existing checkpoints.")
@click.option("--rehearse-failure", is_flag=True,
              help="SIGKILL a worker at a seeded step, recover, compare with a clean run.")
@click.option("--nondeterministic", is_flag=True, help="Allow nondeterministic kernels.")
@click.option("--repo", type=click.Path(file_okay=False), default=None,
              help="Model repository to save the trained version into.")
@click.option("--model-name", default="flights", show_default=True)
@click.option("--lineage", default=None,
              help="Lineage store (default $SCALELAB_LINEAGE or ./.scalelab/lineage.db).")
@click.option("--no-lineage", is_flag=True, help="Do not register the model in the lineage store.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the run's files here (default: a temporary folder).")
@click.option("--records", type=click.Path(dir_okay=False), default=None,
              help="Append this run's record (stage train) to a JSON Lines file.")
@json_option
@click.pass_context
def app(ctx: click.Context, epochs: int, steps: int | None, nproc: int, nnodes: str,
        rdzv_endpoint: str | None, rdzv_id: str | None, max_restarts: int, device: str,
        checkpoint_dir: str | None, checkpoint_interval: str | None, mtbf: str, keep: int,
        async_checkpoint: bool, no_resume: bool, rehearse_failure: bool,
        nondeterministic: bool, repo: str | None, model_name: str, lineage: str | None,
        no_lineage: bool, run_dir: str | None, records: str | None, as_json: bool,
        timeout: str, **common: Any) -> None:
    """Train the flights delay-class model under torchrun (gloo on CPU, nccl on CUDA).

    Example: scalelab train --nproc 2 --limit 50000 --repo models --json
    """
    if ctx.invoked_subcommand is not None:
        return
    transformer = split_options(ctx, common)
    if transformer.get("model") == "transformer":
        run_transformer(
            ctx, transformer, as_json=as_json, nproc=nproc, nnodes=nnodes,
            rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, max_restarts=max_restarts,
            device=device, timeout=timeout, run_dir=run_dir, records=records,
            checkpoint_dir=checkpoint_dir, checkpoint_interval=checkpoint_interval,
            rehearse_failure=rehearse_failure, no_resume=no_resume,
            nondeterministic=nondeterministic, batch=common["batch"], steps=steps,
            seed=common["seed"], lr=common["lr"], hidden=common["hidden"],
            threads=common["threads"])
        return
    every, auto = _interval(checkpoint_interval)
    cfg = build_config(
        **common, epochs=epochs, max_steps=steps, checkpoint_dir=checkpoint_dir,
        checkpoint_every=every, checkpoint_auto=auto, mtbf_s=parse_duration(mtbf, what="--mtbf"),
        keep=keep, async_checkpoint=async_checkpoint, resume=not no_resume,
        rehearse_failure=rehearse_failure, deterministic=not nondeterministic)
    lc = LaunchConfig(nproc=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                      max_restarts=max_restarts, cuda=device == "cuda",
                      timeout_s=parse_duration(timeout, what="--timeout"), run_dir=run_dir)
    with live_progress(f"train on {nproc} process(es)") as progress:
        result = run_training(
            cfg, lc, repo=repo, model_name=model_name, lineage=False if no_lineage else lineage,
            on_warning=_warn, on_progress=lambda step, total, loss: progress.update(
                completed=step, total=total, note=f"train: step {step}/{total}, loss {loss:.4f}"))
    if records:
        from scalelab.lab.core.records import append_records, new_experiment_id
        from scalelab.system.train.bench import run_record

        append_records(records, [run_record(result, experiment=new_experiment_id("train"),
                                            variable="workers", level=result.summary.world)])
    emit(result, as_json, _render(result))


def _append_one(path: str, record: Any) -> None:
    from scalelab.lab.core.records import append_records

    append_records(path, [record])


def _render_bench(b: Any) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        for sw in b.sweeps:
            t = Table(title=f"workers sweep, {sw.mode} scaling, batch {sw.batch}")
            for col in ("procs", "threads", "global batch", "samples/s", "speedup",
                        "efficiency", "Karp–Flatt", "comm share", "limiting resource"):
                t.add_column(col, justify="right")
            for lv in sw.levels:
                t.add_row(str(lv.nproc), str(lv.threads), str(lv.global_batch),
                          f"{lv.samples_per_s:,.0f}", f"{lv.speedup:.2f}×",
                          f"{lv.efficiency:.0%}",
                          "–" if lv.karp_flatt is None else f"{lv.karp_flatt:.3f}",
                          f"{lv.comm_share:.0%}", lv.limiting_resource)
            c.print(t)
            if sw.usl is not None:
                c.print(f"USL: α={sw.usl['alpha']:.3g} β={sw.usl['beta']:.3g} "
                        f"peak at N={sw.usl['n_peak']:.3g}")
            c.print(sw.verdict)
        c.print(f"experiment {b.experiment}: {len(b.records)} records")
    return render


@app.command()
@common_train_options
@transformer_options(sweep=True)
@click.option("--nproc", "nprocs", default="1,2,4", show_default=True,
              help="Process counts to sweep (must include 1).")
@click.option("--batch", "batches", default="512", show_default=True,
              help="Global (strong) or per-worker (weak) batch; a list sweeps each.")
@click.option("--steps", type=int, default=40, show_default=True, help="Steps per level.")
@click.option("--records", type=click.Path(dir_okay=False), default=None,
              help="Append the records to this JSON Lines file.")
@prices_option
@click.option("--price-per-core-hour", type=click.FloatRange(min=0), default=None,
              help="Overrides the price table's core_hour_usd (--prices): each level's "
                   "cost from the CPU-seconds it used.")
@json_option
@click.pass_context
def bench(ctx: click.Context, nprocs: str, batches: str, steps: int, records: str | None,
          as_json: bool, timeout: str, prices_file: Path | None,
          price_per_core_hour: float | None,
          **common: Any) -> None:
    """Sweep worker processes: throughput, efficiency, communication share, Karp–Flatt, USL.

    Example: scalelab train bench --nproc 1,2,4 --mode strong --batch 64,4096 --limit 60000
    """
    from scalelab.lab.core.records import new_experiment_id
    from scalelab.system.train.bench import run_bench

    transformer = split_options(ctx, common)
    if transformer.get("model") == "transformer":
        run_transformer_bench(ctx, transformer, as_json=as_json, nprocs=nprocs,
                              batches=batches, steps=steps, seed=common["seed"],
                              lr=common["lr"], hidden=common["hidden"],
                              threads=common["threads"], timeout=timeout, records=records)
        return
    batch_list = parse_list(batches, what="--batch", kind=int)
    cfg = build_config(**common, batch=batch_list[0], max_steps=steps, flop_count=True)
    result = run_bench(
        cfg, nprocs=parse_list(nprocs, what="--nproc", kind=int), batches=batch_list,
        experiment=new_experiment_id("train-bench"),
        timeout_s=parse_duration(timeout, what="--timeout"),
        on_level=lambda msg: err_console.print(f"[dim]running {msg}[/]", markup=True),
        on_warning=_warn, price_per_core_hour=resolve_prices(
            prices_file, core_hour_usd=price_per_core_hour).core_hour_usd,
        # Each worker count's record as soon as it is measured: a bench stopped later (a
        # diagnose deadline, Ctrl-C) keeps the counts it measured.
        on_record=None if not records else functools.partial(_append_one, records))
    emit({"experiment": result.experiment, "sweeps": result.sweeps,
          "records_file": records, "records": len(result.records)},
         as_json, _render_bench(result))


def _render_law(r: Any) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        t = Table(title="scaling-law grid (held-out cross-entropy)")
        for col in ("width", "data", "params N", "samples D", "FLOPs", "6ND", "test loss",
                    "accuracy", "wall"):
            t.add_column(col, justify="right")
        for p in r.points:
            t.add_row(str(p.width), f"{p.fraction:g}", f"{p.n_params:,}", f"{p.samples:,}",
                      f"{p.flops:.3g}", f"{p.flops_6nd:.3g}", f"{p.test_loss:.4f}",
                      f"{p.accuracy:.3f}", format_duration(p.wall_s))
        c.print(t)
        c.print("loss-vs-compute frontier: " + " → ".join(
            f"w{p.width}/d{p.fraction:g} ({p.flops_6nd:.2g} FLOP, {p.test_loss:.4f})"
            for p in r.frontier))
        if r.fit is None:
            c.print(f"[yellow]no fit:[/] {r.fit_error}")
            return
        f = r.fit
        c.print(f"L(N, D) = {f.E:.4g} + {f.A:.4g}/N^{f.alpha:.3g} + {f.B:.4g}/D^{f.beta:.3g} "
                f"(rms log residual {f.rms_log_residual:.3g})")
        for w in f.warnings:
            c.print(f"[yellow]fit warning:[/] {w}")
        if r.plan is None:
            c.print(f"[yellow]{r.fit_error}[/]")
            return
        p = r.plan
        c.print(f"budget {p.budget_flops:.3g} FLOP (C = 6ND): N_opt ≈ {p.n_opt:,.0f} params, "
                f"D_opt ≈ {p.d_opt:,.0f} samples ({p.samples_per_param:.3g} per param), "
                f"predicted loss {p.predicted_loss:.4f}")
        c.print(f"next unit of compute: {p.dloss_per_gflop:.3g} loss per GFLOP, "
                f"{p.dloss_per_doubling:.3g} per doubling")
        b = p.best_measured
        c.print(f"best measured within budget: width {b.width}, data {b.fraction:g}, "
                f"loss {b.test_loss:.4f}")
    return render


@app.command("scaling-law")
@click.option("--dataset", "data_dir", type=click.Path(file_okay=False), default=None,
              help="Dataset dir with train.parquet/test.parquet (default: raw flights CSV).")
@click.option("--widths", default="16,32,64", show_default=True, help="Hidden widths (N axis).")
@click.option("--data", "fractions", default="0.1,0.3,1.0", show_default=True,
              help="Fractions of the training rows (D axis).")
@click.option("--limit", default="100000", show_default=True,
              help="Training rows the fractions are taken of (or a fraction of all).")
@click.option("--epochs", type=int, default=1, show_default=True)
@click.option("--batch", type=int, default=512, show_default=True)
@click.option("--lr", type=float, default=2e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--budget", default=None, help="Compute budget in FLOP to plan for (e.g. 1e12); "
              "default 10x the largest grid run.")
@click.option("--threads", type=int, default=None, help="Threads (default: all cores).")
@click.option("--records", type=click.Path(dir_okay=False), default=None,
              help="Append one record per grid point (stage train.scaling_law).")
@json_option
def scaling_law(data_dir: str | None, widths: str, fractions: str, limit: str, epochs: int,
                batch: int, lr: float, seed: int, budget: str | None, threads: int | None,
                records: str | None, as_json: bool) -> None:
    """Train a grid of model sizes x data sizes, fit L(N, D), plan compute.

    Example: scalelab train scaling-law --widths 16,32,64 --data 0.1,0.3,1.0
    """
    from scalelab.system.train.scaling_law import curves, grid_records, run_grid

    cfg = TabularRunConfig(data=data_dir, limit=_float_or_none(limit, "--limit"), epochs=epochs,
                           batch=batch, base_batch=batch, lr=lr, seed=seed)
    result = run_grid(cfg, widths=parse_list(widths, what="--widths", kind=int),
                      fractions=parse_list(fractions, what="--data"),
                      budget=_si(budget, "--budget"), threads=threads,
                      on_point=lambda m: err_console.print(f"[dim]training {m}[/]", markup=True))
    if records:
        from scalelab.lab.core.records import append_records

        append_records(records, grid_records(result))
    emit({**vars(result), "curves": curves(result.points)}, as_json, _render_law(result))
