"""`scalelab fit ...`: fit scaling curves to measured data (a CSV or a records file)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, json_option, plot_option
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.fits import ScalingFit, fit_scaling
from scalelab.lab.core.knee import find_knee
from scalelab.lab.core.records import read_records
from scalelab.lab.core.usl import Param


@click.group(no_args_is_help=True)
def app() -> None:
    """Fit scaling laws to measurements (USL, Amdahl, Chinchilla)."""


def read_xy_csv(
    path: Path, x: str | None, y: str | None
) -> tuple[list[float], list[float], str, str]:
    """Two numeric columns of a CSV file (default: the first two), with row-numbered errors."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            if len(header) < 2:
                raise BadInputError(f"{path}: needs a header row with at least two columns")
            xc, yc = x or header[0], y or header[1]
            for c, flag in ((xc, "--x"), (yc, "--y")):
                if c not in header:
                    raise BadInputError(
                        f"{path}: no column {c!r} ({flag}); columns are: {', '.join(header)}"
                    )
            xs: list[float] = []
            ys: list[float] = []
            for i, row in enumerate(reader, start=2):
                try:
                    xv, yv = float(row[xc]), float(row[yc])
                except (TypeError, ValueError):
                    raise BadInputError(
                        f"{path}:{i}: {xc}={row.get(xc)!r}, {yc}={row.get(yc)!r} are not both "
                        "numbers; fix or remove that row"
                    ) from None
                if not (math.isfinite(xv) and math.isfinite(yv)):
                    raise BadInputError(f"{path}:{i}: values must be finite numbers")
                xs.append(xv)
                ys.append(yv)
    except FileNotFoundError:
        raise BadInputError(f"{path} does not exist; pass --csv with a CSV file") from None
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not UTF-8 text ({e.reason})") from e
    except csv.Error as e:
        raise BadInputError(f"{path}: malformed CSV ({e})") from e
    return xs, ys, xc, yc


def xy_from_records(path: Path, stage: str | None, y: str) -> tuple[list[float], list[float]]:
    """(level, metric) of successful records; metric is `rate` or a `quality` key."""
    recs = [r for r in read_records(path) if r.ok and (stage is None or r.stage == stage)]
    if not recs:
        raise BadInputError(
            f"{path}: no successful records{f' for stage {stage!r}' if stage else ''}"
        )
    xs: list[float] = []
    ys: list[float] = []
    for r in recs:
        v: float | None = r.rate if y == "rate" else r.quality.get(y)
        if v is not None:
            xs.append(r.level)
            ys.append(float(v))
    if not xs:
        raise BadInputError(f"{path}: no record has a value for {y!r}; try --y rate")
    return xs, ys


def _fmt_param(p: Param) -> tuple[str, str, str]:
    se = "—" if p.stderr is None else f"{p.stderr:.4g}"
    ci = "—" if p.ci_low is None or p.ci_high is None else f"[{p.ci_low:.4g}, {p.ci_high:.4g}]"
    return f"{p.value:.6g}", se, ci


def _fmt(v: float) -> str:
    return "∞" if math.isinf(v) else f"{v:.4g}"


def _render(fit: ScalingFit, knee: float | None, xs: list[float], ys: list[float]) -> Any:
    def render(c: Console) -> None:
        if fit.usl is not None:
            u = fit.usl
            t = Table(title=f"USL fit ({u.n_points} points, {u.confidence:.0%} intervals)")
            for col in ("parameter", "value", "std. error", "interval"):
                t.add_column(col)
            t.add_row("γ (throughput of one)", *_fmt_param(u.gamma))
            t.add_row("α (contention)", *_fmt_param(u.alpha))
            t.add_row("β (coherency)", *_fmt_param(u.beta))
            c.print(t)
            c.print(
                f"residual std. error {('—' if u.rse is None else f'{u.rse:.4g}')}; "
                f"N_peak {_fmt(u.n_peak)}, N_opt {_fmt(u.n_opt)}, "
                f"X_limit {_fmt(u.x_limit)}, X at peak {_fmt(u.x_peak)}"
            )
        m = Table(title="Model choice by AIC (lowest wins)")
        for col in ("model", "parameters", "RSS", "AIC"):
            m.add_column(col)
        for mf in fit.models:
            params = ", ".join(f"{k}={v:.4g}" for k, v in mf.params.items())
            mark = " ◀ chosen" if mf.model == fit.chosen else ""
            m.add_row(mf.model + mark, params, f"{mf.rss:.4g}", f"{mf.aic:.2f}")
        c.print(m)
        p = Table(title="Per level (medians)")
        for col in ("N", "throughput", "efficiency", "Karp–Flatt"):
            p.add_column(col, justify="right")
        for lv, x, e, kf in zip(
            fit.levels, fit.throughput, fit.efficiency, fit.karp_flatt, strict=True
        ):
            p.add_row(f"{lv:g}", f"{x:.4g}", f"{e:.0%}", "—" if kf is None else f"{kf:.3f}")
        c.print(p)
        c.print(f"knee: {'none found' if knee is None else f'N = {knee:g}'}")

    return render


@app.command("usl")
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(path_type=Path),
    help="CSV file with a resource column and a throughput column.",
)
@click.option(
    "--records",
    "records_path",
    type=click.Path(path_type=Path),
    help="A scalelab records file (JSON Lines): uses level and rate.",
)
@click.option("--x", "x_col", help="Resource column of the CSV (default: the first column).")
@click.option(
    "--y",
    "y_col",
    help="Throughput column (CSV; default: the second column) or, "
    "with --records, 'rate' (default) or a quality key.",
)
@click.option("--stage", help="With --records: only records of this stage.")
@plot_option("the points and the chosen fit")
@json_option
def usl_cmd(
    csv_path: Path | None,
    records_path: Path | None,
    x_col: str | None,
    y_col: str | None,
    stage: str | None,
    plot: Path | None,
    as_json: bool,
) -> None:
    """Fit the Universal Scalability Law, with Amdahl and linear fits compared by AIC.

    Example: scalelab fit usl --csv throughput.csv --x workers --y rps
    """
    if (csv_path is None) == (records_path is None):
        raise BadUsageError("give exactly one of --csv FILE or --records FILE")
    if records_path is not None:
        if x_col:
            raise BadUsageError("--x applies to --csv; records always use their level")
        xs, ys = xy_from_records(records_path, stage, y_col or "rate")
        xname, yname = "level", y_col or "rate"
    else:
        assert csv_path is not None
        xs, ys, xname, yname = read_xy_csv(csv_path, x_col, y_col)
    fit = fit_scaling(xs, ys)
    knee = find_knee(fit.levels, fit.throughput, curve="concave", direction="increasing")
    data = {
        "x": xname,
        "y": yname,
        "points": [{"x": a, "y": b} for a, b in zip(xs, ys, strict=True)],
        "chosen": fit.chosen,
        "usl": fit.usl,
        "models": fit.models,
        "levels": fit.levels,
        "throughput": fit.throughput,
        "efficiency": fit.efficiency,
        "karp_flatt": fit.karp_flatt,
        "knee": knee,
        "plot": str(plot) if plot else None,
    }
    if plot is not None:
        from scalelab.lab.report import figures

        figures.save(
            figures.scaling_figure(
                [figures.Curve(name=yname, x=xs, y=ys)],
                variable=xname,
                ylabel=yname,
                title=f"{yname} vs {xname}: {fit.chosen} fit",
            ),
            plot,
        )
    emit(data, as_json, _render(fit, knee, xs, ys))


from scalelab.cli.chinchilla import fit_chinchilla  # noqa: E402

app.add_command(fit_chinchilla, "chinchilla")
