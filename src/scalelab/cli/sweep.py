"""`scalelab sweep`: scale the user's own command one variable at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._cluster import open_cluster
from scalelab.cli._output import emit, err_console, json_option, parse_list, plot_option
from scalelab.cli._progress import live_progress
from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.lab.core.machine import Machine
from scalelab.lab.core.records import append_records, new_experiment_id
from scalelab.lab.core.sweep import (
    Executor,
    RunResult,
    SweepConfig,
    SweepResult,
    level_summary,
    run_here,
    run_sweep,
)
from scalelab.lab.core.units import format_bytes, parse_duration
from scalelab.lab.load.cluster import Cluster


def _parse_var(text: str) -> tuple[str, list[float]]:
    if "=" not in text:
        raise BadUsageError(f"--var {text!r}: write NAME=LEVELS, e.g. --var workers=1,2,5,10")
    name, levels = text.split("=", 1)
    values = parse_list(levels, what=f"--var {name}")
    return name.strip(), values


def _render(res: SweepResult, records_path: Path) -> Any:
    def render(c: Console) -> None:
        cfg = res.config
        t = Table(title=f"Sweep of {cfg.variable}, {cfg.repeats} repeat(s) per level")
        for col in (cfg.variable, "ok", "wall s", "thru", "eff", "K–F", "CPU s", "RSS", "busy"):
            t.add_column(col, justify="right")
        failures: list[str] = []
        for row in level_summary(res):
            wall = row["wall_s_median"]
            thr = row["throughput_median"]
            eff = row.get("efficiency")
            kf = row.get("karp_flatt")
            rss = row["peak_rss_bytes_max"]
            lim = str(row["limiting_resource"] or "")
            busy = lim.replace(" cores", "").replace("not cpu ", "").replace("cpu ", "")
            t.add_row(
                f"{row['level']:g}",
                f"{int(row['runs'] or 0) - int(row['failures'] or 0)}/{row['runs']}",
                "—" if wall is None else f"{float(wall):.3f}",
                "—" if thr is None else f"{float(thr):.4g}",
                "—" if eff is None else f"{float(eff):.0%}",
                "—" if kf is None else f"{float(kf):.3f}",
                "—" if row["cpu_s_median"] is None else f"{float(row['cpu_s_median']):.2f}",
                "—" if rss is None else format_bytes(float(rss)),
                "failed" if wall is None else busy,
            )
        for r in res.records:
            if not r.ok:
                failures.append(f"{cfg.variable}={r.level:g} #{r.repeat + 1}: {r.error}")
        c.print(t)
        for line in failures:
            c.print(f"[red]failed[/] {line}", markup=True, highlight=False)
        if res.fit is not None:
            f = res.fit
            line = f"best model by AIC: {f.chosen}"
            if f.usl is not None:
                u = f.usl
                line += (
                    f"; USL α={u.alpha.value:.4g} β={u.beta.value:.4g} "
                    f"γ={u.gamma.value:.4g}, N_peak={u.n_peak:.3g}"
                )
            c.print(line)
            c.print(
                f"knee: {'none found' if res.knee is None else f'{cfg.variable} = {res.knee:g}'}"
            )
        else:
            c.print(f"no fit: {res.fit_error}")
        c.print(
            "wall: median of the repeats (ranges in --json); thru: throughput (runs/s, or the "
            "metric); eff: efficiency vs the first level; K–F: Karp–Flatt serial fraction; "
            "busy: cores the process tree kept busy / cores available"
        )
        c.print(f"records appended to {records_path}")

    return render


def _on_cluster(cluster: Cluster) -> Executor:
    def execute(cmd: list[str], extra_env: dict[str, str],
                cfg: SweepConfig) -> tuple[RunResult, Machine, str]:
        # The worker's own environment (its PATH, its venv) plus the level's variable.
        fut = cluster.client.submit(run_here, cmd, extra_env, cfg, pure=False)
        try:
            out: tuple[RunResult, Machine, str] = fut.result(timeout=cfg.timeout_s + 60)
        except Exception as e:
            raise RunFailedError(f"the cluster could not run {cmd[0]!r}: "
                                 f"{type(e).__name__}: {e}") from e
        return out

    return execute


def _plot(levels: Sequence[Mapping[str, Any]], variable: str, experiment: str, path: Path) -> None:
    from scalelab.lab.report import figures

    # The median per level (the JSON's throughput_median): the same points the fit is made on.
    rows = [r for r in levels if r["throughput_median"] is not None]
    curve = figures.Curve(
        name=experiment,
        x=[float(r["level"]) for r in rows],
        y=[float(r["throughput_median"]) for r in rows],
    )
    figures.save(
        figures.scaling_figure(
            [curve], variable=variable, ylabel="throughput", title=f"sweep of {variable}"
        ),
        path,
    )


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--var",
    "var",
    required=True,
    help="NAME=LEVELS, e.g. workers=1,2,5,10; {NAME} in the command is replaced.",
)
@click.option("--repeats", type=int, default=1, show_default=True, help="Runs per level.")
@click.option("--metric", help="Parse a rate from stdout: 'json:KEY' or a regex with one group.")
@click.option(
    "--mode",
    type=click.Choice(["strong", "weak"]),
    default="strong",
    show_default=True,
    help="strong: fixed work (throughput = 1/wall); weak: work grows with the level.",
)
@click.option(
    "--timeout",
    "timeout",
    default="10m",
    show_default=True,
    help="Per-run limit; a run past it is killed and recorded as failed.",
)
@click.option(
    "--records",
    "records_path",
    type=click.Path(path_type=Path),
    default=Path("results/records.jsonl"),
    show_default=True,
    help="Records file (JSON Lines) to append to.",
)
@click.option("--experiment", help="Experiment id (default: sweep-<time>-<random>).")
@plot_option("throughput per level (median, range of the repeats) and the chosen fit")
@click.option("--cluster", "cluster_address", metavar="tcp://HOST:PORT",
              help="Run each level's command on a worker of this Dask cluster (one run at a "
                   "time, any free worker); each record names the host it ran on.")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def sweep(
    var: str,
    repeats: int,
    metric: str | None,
    mode: str,
    timeout: str,
    records_path: Path,
    experiment: str | None,
    plot: Path | None,
    cluster_address: str | None,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND at each level of one variable, measure it, and fit the curve.

    Example: scalelab sweep --var workers=1,2,4 --repeats 3 -- python job.py --workers {workers}
    """
    name, levels = _parse_var(var)
    cfg = SweepConfig(
        variable=name,
        levels=levels,
        command=list(command),
        repeats=repeats,
        metric=metric,
        mode="weak" if mode == "weak" else "strong",
        timeout_s=parse_duration(timeout, what="--timeout"),
        experiment=experiment or new_experiment_id("sweep"),
    )
    if not any("{" + name + "}" in a for a in command):
        err_console.print(
            f"warning: the command never mentions {{{name}}}; the level reaches it "
            f"only through the environment variable SCALELAB_{name.upper()}"
        )
    total = len(levels) * repeats
    with open_cluster(cluster_address) as cluster, \
            live_progress(f"sweep {name}", total=total) as progress:

        def on_run(level: float, rep: int, r: RunResult) -> None:
            progress.advance(
                f"{name}={level:g} #{rep + 1}: {'ok' if r.ok else 'FAILED'} {r.wall_s:.2f}s"
            )

        res = run_sweep(cfg, on_run=on_run,
                        execute=run_here if cluster is None else _on_cluster(cluster))
    append_records(records_path, res.records)
    data = {
        "experiment": cfg.experiment,
        "variable": name,
        "levels": level_summary(res),
        "fit": res.fit,
        "knee": res.knee,
        "fit_error": res.fit_error,
        "records_file": str(records_path),
        "records": res.records,
        "plot": str(plot) if plot else None,
    }
    if plot is not None:
        _plot(level_summary(res), name, cfg.experiment, plot)
    emit(data, as_json, _render(res, records_path))
    if not any(r.ok for r in res.records):
        raise RunFailedError(
            f"every run of the command failed (first: {res.records[0].error}); "
            f"the failures were recorded in {records_path}"
        )
