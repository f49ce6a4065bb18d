"""`scalelab plan memory`: bytes per rank of a transformer's training, by strategy (plan.memory),
and with --peak-rss the process's peak RSS (the baseline measured by train.parallel.runtime)."""

from __future__ import annotations

from collections.abc import Callable

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, json_option
from scalelab.lab.core.units import format_bytes
from scalelab.layers.plan.memory import (
    STRATEGIES,
    MemoryPlan,
    MemoryQuery,
    PeakPlan,
    plan_memory,
    plan_peak_rss,
)


def _render(p: MemoryPlan, peak: PeakPlan | None) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        t = Table(title=f"memory per rank: {p.strategy} over {p.world} rank(s), {p.precision}")
        t.add_column("what")
        t.add_column("bytes", justify="right")
        t.add_column("", justify="right")
        t.add_column("formula")
        for name, value in (("parameters", p.param_bytes), ("gradients", p.grad_bytes),
                            ("optimizer state", p.optimizer_bytes),
                            ("activations", p.activation_bytes)):
            key = {"parameters": "params", "gradients": "grads", "optimizer state": "optimizer",
                   "activations": "activations"}[name]
            t.add_row(name, f"{value:,}", format_bytes(value), p.formulas[key])
        t.add_row("total", f"{p.total_bytes:,}", format_bytes(p.total_bytes), "")
        c.print(t)
        c.print(f"{p.params_per_rank:,} parameters on this rank; {p.formulas['state_variant']}; "
                f"{p.tokens_per_micro_batch:,} tokens per micro-batch, {p.in_flight} in flight")
        if peak is not None:
            c.print(f"peak RSS {format_bytes(peak.peak_rss_bytes)} = process baseline "
                    f"{format_bytes(peak.runtime_bytes)} + data {format_bytes(peak.data_bytes)}"
                    f" + tensors {format_bytes(peak.tensor_bytes)} + buffers "
                    f"{format_bytes(peak.buffer_bytes)} ({peak.buffer_formula})")
    return render


@click.command("memory")
@click.option("--params", type=int, required=True, help="Total parameters (embeddings included).")
@click.option("--layers", type=int, required=True, help="Transformer blocks.")
@click.option("--hidden", type=int, required=True, help="Model width.")
@click.option("--seq", type=int, required=True, help="Tokens per sequence.")
@click.option("--batch", type=int, required=True, help="Global batch in sequences per step.")
@click.option("--strategy", type=click.Choice(list(STRATEGIES)), required=True)
@click.option("--world", type=int, required=True, help="Ranks (the parallel degree).")
@click.option("--heads", type=int, default=None, help="Attention heads (default hidden/64).")
@click.option("--kv-heads", type=int, default=None, help="Key/value heads (default = heads).")
@click.option("--ffn", type=int, default=None, help="SwiGLU inner width (default ceil(8h/3)).")
@click.option("--vocab", type=int, default=0, show_default=True,
              help="Vocabulary size (0: unknown, no logits term).")
@click.option("--tied", is_flag=True, help="Embedding and output head share one table.")
@click.option("--precision", type=click.Choice(["fp32", "mixed"]), default="fp32",
              show_default=True, help="fp32: 4+4+8 bytes/param; mixed: 2+2+12 (ZeRO's K=12).")
@click.option("--micro-batches", type=int, default=1, show_default=True,
              help="Pipeline micro-batches per step.")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b"]), default="1f1b",
              show_default=True, help="Pipeline schedule.")
@click.option("--tp", type=int, default=2, show_default=True,
              help="fsdp+tp: the tensor-parallel degree t (FSDP over the --world / t groups).")
@click.option("--peak-rss", is_flag=True,
              help="Also predict the process's peak RSS: measure the process baseline here (a "
                   "probe process, cached per machine and torch version) and add it, the data "
                   "and the strategy's buffers.")
@click.option("--runtime-bytes", type=int, default=None,
              help="The process baseline in bytes (e.g. measured on the target machine); "
                   "implies --peak-rss without probing.")
@click.option("--data-bytes", type=int, default=0, show_default=True,
              help="Training data each rank holds in memory (with --peak-rss).")
@json_option
def plan_memory_cmd(params: int, layers: int, hidden: int, seq: int, batch: int, strategy: str,
                    world: int, heads: int | None, kv_heads: int | None, ffn: int | None,
                    vocab: int, tied: bool, precision: str, micro_batches: int, schedule: str,
                    tp: int, peak_rss: bool, runtime_bytes: int | None, data_bytes: int,
                    as_json: bool) -> None:
    """Bytes per rank (parameters, gradients, optimizer, activations) of a transformer's training.

    Example: scalelab plan memory --params 1000000 --layers 4 --hidden 128 --seq 128 --batch 8
    --strategy fsdp --world 4 --vocab 256
    """
    q = MemoryQuery(params=params, layers=layers, hidden=hidden, seq=seq, batch=batch,
                    strategy=strategy,  # type: ignore[arg-type]
                    world=world, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab, tied=tied,
                    precision=precision,  # type: ignore[arg-type]
                    micro_batches=micro_batches,
                    schedule=schedule,  # type: ignore[arg-type]
                    tp=tp)
    p = plan_memory(q)
    peak = None
    doc = p.to_dict()
    if peak_rss or runtime_bytes is not None:
        baseline = None
        if runtime_bytes is None:
            from scalelab.lab.core.machine import available_cores
            from scalelab.system.train.launch import plan_threads
            from scalelab.system.train.parallel.runtime import measure_baseline

            threads, _ = plan_threads(world, None, available_cores())
            baseline = measure_baseline(strategy, threads=threads)
            runtime_bytes = baseline.peak_rss_bytes
        peak = plan_peak_rss(q, runtime_bytes=runtime_bytes, data_bytes=data_bytes)
        doc["peak_rss"] = {**peak.to_dict(),
                           "baseline": baseline.to_dict() if baseline is not None else None}
    emit(doc, as_json, _render(p, peak))
