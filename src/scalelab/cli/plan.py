"""`scalelab plan ...`: planning calculators (laws, HPA, checkpoints, learning rate, compute)."""

from __future__ import annotations

from collections.abc import Callable

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, json_option, parse_list
from scalelab.lab.core.laws import LawTable, amdahl_table, gustafson_table


@click.group(no_args_is_help=True)
def app() -> None:
    """Planning calculators: what the laws predict before you measure."""


def _render_law(t: LawTable, title: str) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        table = Table(title=f"{title}, parallel fraction {t.parallel_fraction:g}")
        table.add_column("workers", justify="right")
        table.add_column("speedup", justify="right")
        table.add_column("efficiency", justify="right")
        for r in t.rows:
            table.add_row(f"{r.workers:g}", f"{r.speedup:.1f}×", f"{r.efficiency:.0%}")
        c.print(table)
        c.print(f"limit as workers → ∞: {t.limit:.1f}×" if t.limit != float("inf") else
                "limit as workers → ∞: unbounded")
    return render


_PARALLEL = click.option("--parallel-fraction", "-p", type=float, required=True,
                         help="Fraction of the work that parallelises, 0..1 (e.g. 0.95).")
_WORKERS = click.option("--workers", default="1,2,4,8,16,32,64", show_default=True,
                        help="Comma-separated worker counts.")


@app.command()
@_PARALLEL
@_WORKERS
@json_option
def amdahl(parallel_fraction: float, workers: str, as_json: bool) -> None:
    """Fixed-size speedup (Amdahl): how far more workers speed up one job.

    Example: scalelab plan amdahl --parallel-fraction 0.95 --workers 1,8,64,512
    """
    t = amdahl_table(parallel_fraction, parse_list(workers, what="--workers"))
    emit(t, as_json, _render_law(t, "Amdahl speedup"))


@app.command()
@_PARALLEL
@_WORKERS
@json_option
def gustafson(parallel_fraction: float, workers: str, as_json: bool) -> None:
    """Scaled speedup (Gustafson): how much bigger a job N workers finish in the same time.

    Example: scalelab plan gustafson --parallel-fraction 0.95 --workers 1,8,64
    """
    t = gustafson_table(parallel_fraction, parse_list(workers, what="--workers"))
    emit(t, as_json, _render_law(t, "Gustafson scaled speedup"))


from scalelab.cli.plan_ops import checkpoint, hpa, lr  # noqa: E402

app.add_command(hpa)
app.add_command(checkpoint)
app.add_command(lr)

from scalelab.cli.chinchilla import plan_chinchilla  # noqa: E402

app.add_command(plan_chinchilla, "chinchilla")

from scalelab.cli.plan_memory import plan_memory_cmd  # noqa: E402

app.add_command(plan_memory_cmd, "memory")
