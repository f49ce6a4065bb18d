"""`scalelab fit chinchilla` and `scalelab plan chinchilla`: the Chinchilla law, fitted and used."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import (
    emit,
    err_console,
    json_option,
    jsonable,
    parse_list,
    plot_option,
)
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.jsonfile import read_json_object
from scalelab.layers.plan.chinchilla import (
    EPOCH_GRID,
    EPOCH_PARAMS,
    PARAM_NAMES,
    ChinchillaFit,
    ChinchillaParams,
    ComputeOptimal,
    ModelSizeCheck,
    StartGrid,
    compute_optimal,
    drop_highest,
    evaluate_model_size,
    params_from_values,
)
from scalelab.layers.plan.chinchilla import (
    fit_chinchilla as fit_law,
)

EPOCH_SOURCE = ("Epoch AI's estimates (Besiroglu et al. 2024, refit of Hoffmann et al. 2022); "
                "pass --params or --fit to use your own")


def read_points(path: Path, *, n_col: str, d_col: str | None, c_col: str, loss_col: str
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """N, D, loss from a CSV; D from `d_col` if given, else C/(6N) from `c_col`."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.DictReader(fh))
            header = list(rows[0].keys()) if rows else []
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise BadInputError(f"{path}: cannot read as CSV ({e})") from None
    if not rows:
        raise BadInputError(f"{path}: no data rows; give a CSV with a header and one row per run")
    wanted = [("--n-col", n_col), ("--loss-col", loss_col),
              ("--d-col", d_col) if d_col is not None else ("--c-col", c_col)]
    for flag, col in wanted:
        if col not in header:
            hint = (" (or give tokens directly with --d-col)" if flag == "--c-col" else "")
            raise BadInputError(f"{path}: no column {col!r} for {flag}{hint}; columns are "
                                f"{', '.join(repr(h) for h in header)}")

    def column(col: str) -> np.ndarray:
        out = np.empty(len(rows))
        for i, r in enumerate(rows):
            text = (r.get(col) or "").strip()
            try:
                v = float(text)
            except ValueError:
                v = math.nan
            if not (math.isfinite(v) and v > 0):
                raise BadInputError(f"{path}: line {i + 2}, column {col!r}: {text!r} is not a "
                                    "number > 0 (sizes, tokens, FLOP and losses must be positive)")
            out[i] = v
        return out

    n = column(n_col)
    if d_col is not None:
        return n, column(d_col), column(loss_col), f"column {d_col!r}"
    return n, column(c_col) / (6.0 * n), column(loss_col), f"C/(6N) from column {c_col!r}"


def _render_fit(res: dict[str, Any], fit: ChinchillaFit) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        t = Table(title="Chinchilla fit  L(N, D) = E + A/N^alpha + B/D^beta")
        t.add_column("parameter")
        t.add_column("estimate", justify="right")
        if fit.standard_errors:
            t.add_column(f"bootstrap SE ({fit.bootstrap})", justify="right")
        for nm in PARAM_NAMES:
            row = [nm, f"{getattr(fit, nm):.6g}"]
            if fit.standard_errors:
                row.append(f"{fit.standard_errors[nm]:.3g}")
            t.add_row(*row)
        c.print(t)
        c.print(f"{fit.n_points} points ({res['rows_read']} read, {res['dropped_highest']} "
                f"highest-loss dropped); D = {res['d_source']}")
        c.print(f"objective (sum Huber, delta {fit.huber_delta:g}) {fit.loss:.6g}; "
                f"rms log residual {fit.rms_log_residual:.4f}; "
                f"{fit.starts_at_best}/{fit.starts} starts reached the best")
        c.print(f"compute-optimal: N_opt ∝ C^{fit.beta / (fit.alpha + fit.beta):.3f}, "
                f"D_opt ∝ C^{fit.alpha / (fit.alpha + fit.beta):.3f}"
                if fit.alpha > 0 and fit.beta > 0 else
                "no compute-optimal split (an exponent is 0)")
    return render


@click.command("chinchilla")
@click.option("--csv", "csv_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CSV with one row per training run.")
@click.option("--n-col", default="Model Size", show_default=True, help="Column of model size N.")
@click.option("--d-col", default=None, help="Column of data D (tokens); overrides --c-col.")
@click.option("--c-col", default="Training FLOP", show_default=True,
              help="Column of training compute C; D = C/(6N) when --d-col is not given.")
@click.option("--loss-col", default="loss", show_default=True, help="Column of the loss.")
@click.option("--drop-highest", default=0, show_default=True, type=click.IntRange(min=0),
              help="Drop the K highest-loss rows first (Epoch dropped 5 of 245).")
@click.option("--grid", "grid_kind", type=click.Choice(["scaled", EPOCH_GRID]), default="scaled",
              show_default=True,
              help="Starting points: data-scaled (points^5) or Epoch's 4500 fixed starts (~1 min).")
@click.option("--grid-points", default=3, show_default=True, type=click.IntRange(1, 10),
              help="Values per axis of the scaled grid (3 -> 171 starts on Epoch's data).")
@click.option("--huber-delta", default=1e-3, show_default=True, type=click.FloatRange(min=0,
              min_open=True), help="Huber threshold on log-loss residuals.")
@click.option("--bootstrap", default=100, show_default=True, type=click.IntRange(min=0),
              help="Resamples for standard errors (0 to skip).")
@click.option("--seed", default=0, show_default=True, type=int, help="Bootstrap seed.")
@plot_option("every run's loss against its compute and the fitted compute-optimal loss")
@json_option
def fit_chinchilla(csv_path: Path, n_col: str, d_col: str | None, c_col: str, loss_col: str,
                       drop_highest: int, grid_kind: str, grid_points: int, huber_delta: float,
                       bootstrap: int, seed: int, plot: Path | None, as_json: bool) -> None:
    """Fit the Chinchilla law L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. Approach 3).

    Huber loss (delta 1e-3) on log loss, L-BFGS from a grid of starts, best kept. The --json
    output can be given to `scalelab plan chinchilla --fit FILE`.

    Example: scalelab fit chinchilla --csv chinchilla_epoch.csv --drop-highest 5
    """
    n, d, loss, d_source = read_points(csv_path, n_col=n_col, d_col=d_col, c_col=c_col,
                                       loss_col=loss_col)
    rows = int(loss.size)
    n, d, loss = _drop(n, d, loss, drop_highest)
    grid: StartGrid | str = EPOCH_GRID if grid_kind == EPOCH_GRID else StartGrid(points=grid_points)
    fit = fit_law(n, d, loss, huber_delta=huber_delta, grid=grid, bootstrap=bootstrap,
                         seed=seed)
    for w in fit.warnings:
        err_console.print(f"[yellow]warning:[/] {w}", markup=True, soft_wrap=True)
    res = {**jsonable(fit), "csv": str(csv_path), "rows_read": rows,
           "dropped_highest": drop_highest, "d_source": d_source,
           "plot": str(plot) if plot else None}
    if plot is not None:
        from scalelab.lab.report import figures

        figures.save(figures.chinchilla_figure(
            n.tolist(), d.tolist(), loss.tolist(), fit.params,
            title=f"Chinchilla fit of {csv_path.name} ({fit.n_points} runs)"), plot)
    emit(res, as_json, _render_fit(res, fit))


def _drop(n: np.ndarray, d: np.ndarray, loss: np.ndarray, k: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if k and k >= loss.size:
        raise BadUsageError(f"--drop-highest {k} leaves nothing of {loss.size} rows")
    return drop_highest(n, d, loss, k)


def load_fit_file(path: Path) -> ChinchillaParams:
    """Parameters from `fit chinchilla --json` output (or any JSON with E, A, B, alpha, beta)."""
    doc = read_json_object(path, fix="give the output of 'scalelab fit chinchilla --json'")
    if isinstance(doc.get("params"), dict):
        doc = doc["params"]
    if any(k not in doc for k in PARAM_NAMES):
        raise BadInputError(f"{path}: needs numbers {', '.join(PARAM_NAMES)} at the top level; "
                            "give the output of 'scalelab fit chinchilla --json'")
    vals = [doc[k] for k in PARAM_NAMES]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
        raise BadInputError(f"{path}: {', '.join(PARAM_NAMES)} must all be numbers")
    return params_from_values(vals)


def _render_plan(res: dict[str, Any], plans: list[ComputeOptimal],
                 checks: list[ModelSizeCheck]) -> Callable[[Console], None]:
    def render(c: Console) -> None:
        p = plans[0].params
        c.print(f"law: E={p.E:.6g} A={p.A:.6g} B={p.B:.6g} alpha={p.alpha:.6g} "
                f"beta={p.beta:.6g} — {res['params_source']}")
        t = Table(title="Compute-optimal allocation (C = 6ND)")
        for col in ("C FLOP", "N_opt", "D_opt", "D/N", "loss", "dL/dC", "dL per 2×C"):
            t.add_column(col, justify="right")
        for o in plans:
            t.add_row(f"{o.compute:.3g}", f"{o.n_opt:.4g}", f"{o.d_opt:.4g}",
                      f"{o.tokens_per_param:.2f}", f"{o.loss:.4f}", f"{o.dloss_dcompute:.3e}",
                      f"{o.dloss_per_doubling:.4f}")
        c.print(t)
        o = plans[0]
        c.print(f"N_opt ∝ C^{o.n_exponent:.3f}, D_opt ∝ C^{o.d_exponent:.3f}, "
                f"L* − E ∝ C^−{o.loss_exponent:.3f}")
        if checks:
            m = Table(title=f"Model size {checks[0].n:.4g} at the same budgets")
            for col in ("C FLOP", "D", "D/N", "loss", "excess loss", "C put to use"):
                m.add_column(col, justify="right")
            for o, k in zip(plans, checks, strict=True):
                m.add_row(f"{o.compute:.3g}", f"{k.d:.4g}", f"{k.tokens_per_param:.2f}",
                          f"{k.loss:.4f}", f"{k.excess_loss:.4f}", f"{k.compute_efficiency:.1%}")
            c.print(m)
    return render


@click.command("chinchilla")
@click.option("--compute", "-c", required=True,
              help="Training compute in FLOP; comma-separated for several (e.g. 1e21,1e22).")
@click.option("--params", default=None,
              help="E,A,B,alpha,beta of the law (default: Epoch AI's estimates).")
@click.option("--fit", "fit_path", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON written by 'scalelab fit chinchilla --json'.")
@click.option("--model-size", type=float, default=None,
              help="Also evaluate this model size N: its loss and the gap to the optimum.")
@json_option
def plan_chinchilla(compute: str, params: str | None, fit_path: Path | None,
                        model_size: float | None, as_json: bool) -> None:
    """Compute-optimal model size and tokens for a budget C = 6ND under the Chinchilla law.

    Reports N_opt, D_opt, tokens per parameter, the predicted loss, and the loss gained per
    next FLOP and per doubling of compute.

    Example: scalelab plan chinchilla --compute 1e21 --model-size 1e10
    """
    if params is not None and fit_path is not None:
        raise BadUsageError("give --params or --fit, not both")
    if params is not None:
        law = params_from_values(parse_list(params, what="--params"))
        source = "--params"
    elif fit_path is not None:
        law = load_fit_file(fit_path)
        source = f"--fit {fit_path}"
    else:
        law, source = EPOCH_PARAMS, EPOCH_SOURCE
    budgets = parse_list(compute, what="--compute")
    plans = [compute_optimal(law, c) for c in budgets]
    checks = ([evaluate_model_size(law, c, model_size) for c in budgets]
              if model_size is not None else [])
    res = {"params": law, "params_source": source, "plans": plans,
           "model_size": checks or None}
    emit(res, as_json, _render_plan(res, plans, checks))

