"""Compute-optimal planning on our own task: a grid of model sizes x data sizes, fitted L(N, D).

Each grid point trains a TabularNet of hidden widths [w, w] on a seeded fraction of the training
rows for the same number of epochs, in this process (one process, all cores: the grid measures
the model, not the launcher), and records its held-out cross-entropy. N is the parameter count
(embeddings included), D the training samples seen. The law L = E + A/N^α + B/D^β is fitted with
the foundation's Chinchilla fit; the compute-optimal split of a budget uses its C = 6ND
convention, and the measured FLOPs (FlopCounterMode, forward + backward) are reported beside it.
On a dozen points of a small tabular model the five parameters are weakly determined: read the
fit's warnings and residual before trusting an extrapolation.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.machine import available_cores
from scalelab.lab.core.records import Record, make_record, new_experiment_id
from scalelab.layers.nets.flights import Preprocess
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.dataset import Tensors, prepare
from scalelab.system.train.evaluate import evaluate
from scalelab.system.train.loop import train
from scalelab.system.train.rank import Rank


@dataclass(frozen=True, kw_only=True)
class GridPoint:
    width: int
    fraction: float
    n_params: int
    samples: int
    """D: training samples seen (steps x batch)."""
    flops: float
    """Measured training FLOPs (FlopCounterMode per sample x D)."""
    flops_6nd: float
    test_loss: float
    train_loss: float
    accuracy: float
    wall_s: float


@dataclass(frozen=True, kw_only=True)
class LawFit:
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    rms_log_residual: float
    at_bounds: list[str]
    warnings: list[str]


@dataclass(frozen=True, kw_only=True)
class Plan:
    budget_flops: float
    n_opt: float
    d_opt: float
    samples_per_param: float
    predicted_loss: float
    dloss_per_gflop: float
    """Loss change bought by the next 1e9 FLOP along the compute-optimal path (negative)."""
    dloss_per_doubling: float
    best_measured: GridPoint
    """The grid point with the lowest loss at or under the budget (None-safe: the cheapest)."""


@dataclass(frozen=True, kw_only=True)
class ScalingLawResult:
    points: list[GridPoint]
    fit: LawFit | None
    fit_error: str | None
    plan: Plan | None
    frontier: list[GridPoint]
    """Points on the loss-vs-FLOPs Pareto frontier, by increasing compute."""


def _frontier(points: list[GridPoint]) -> list[GridPoint]:
    out: list[GridPoint] = []
    for p in sorted(points, key=lambda q: q.flops_6nd):
        if not out or p.test_loss < out[-1].test_loss:
            out.append(p)
    return out


def train_point(cfg: TabularRunConfig, data: Tensors, pre: Preprocess, *, width: int,
                fraction: float, run_dir: Path) -> GridPoint:
    point_cfg = dataclasses.replace(cfg, hidden=[width, width], train_fraction=fraction,
                                    checkpoint_every=0, checkpoint_auto=False,
                                    rehearse_failure=False)
    subset = data.subset_train(fraction, cfg.seed)
    t0 = time.perf_counter()
    report, net, _ = train(point_cfg, subset, pre.cardinalities(), Rank(), run_dir=run_dir)
    wall = time.perf_counter() - t0
    assert net is not None
    ev = evaluate(net, data.test_cat, data.test_num, data.test_y, pre.classes)
    samples = int(report["steps_run"]) * int(report["global_batch"])
    n = int(report["n_params"])
    fps = float(report["flops_per_sample"] or 0.0)
    losses = report["losses"]
    return GridPoint(width=width, fraction=fraction, n_params=n, samples=samples,
                     flops=fps * samples, flops_6nd=6.0 * n * samples, test_loss=ev.loss,
                     train_loss=float(losses[-1][1]) if losses else float("nan"),
                     accuracy=ev.accuracy, wall_s=wall)


def fit_and_plan(points: list[GridPoint], budget: float | None
                 ) -> tuple[LawFit | None, str | None, Plan | None]:
    from scalelab.lab.core.errors import ScalelabError
    from scalelab.layers.plan.chinchilla import compute_optimal, fit_chinchilla

    try:
        f = fit_chinchilla([p.n_params for p in points], [p.samples for p in points],
                           [p.test_loss for p in points])
    except ScalelabError as e:
        return None, str(e), None
    fit = LawFit(E=f.E, A=f.A, B=f.B, alpha=f.alpha, beta=f.beta,
                 rms_log_residual=f.rms_log_residual, at_bounds=list(f.at_bounds),
                 warnings=list(f.warnings))
    c = budget if budget is not None else 10.0 * max(p.flops_6nd for p in points)
    try:
        co = compute_optimal(f, c)
    except ScalelabError as e:
        return fit, f"no compute-optimal plan: {e}", None
    affordable = [p for p in points if p.flops_6nd <= c] or [min(points, key=lambda p: p.flops_6nd)]
    plan = Plan(budget_flops=c, n_opt=co.n_opt, d_opt=co.d_opt,
                samples_per_param=co.tokens_per_param, predicted_loss=co.loss,
                dloss_per_gflop=co.dloss_dcompute * 1e9, dloss_per_doubling=co.dloss_per_doubling,
                best_measured=min(affordable, key=lambda p: p.test_loss))
    return fit, None, plan


def run_grid(cfg: TabularRunConfig, *, widths: list[int], fractions: list[float],
             budget: float | None = None, threads: int | None = None,
             on_point: Callable[[str], None] | None = None) -> ScalingLawResult:
    if not widths or any(w < 1 for w in widths):
        raise BadUsageError("--widths must be positive hidden widths, e.g. 16,32,64")
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise BadUsageError("--data must be fractions in (0, 1], e.g. 0.1,0.3,1.0")
    if len(widths) * len(fractions) < 6:
        raise BadUsageError("the L(N, D) fit has 5 parameters and needs >= 6 grid points; "
                            "give more --widths or --data levels")
    if budget is not None and not budget > 0:
        raise BadUsageError("--budget must be > 0 FLOP")
    data, pre, _ = prepare(cfg.data, cfg.limit, cfg.seed)
    smallest = max(1, round(data.n_train * min(fractions)))
    if cfg.batch > smallest:
        raise BadUsageError(f"--batch {cfg.batch} exceeds the {smallest} rows of the smallest data "
                            "fraction; lower --batch or raise --limit")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads or available_cores())
    points: list[GridPoint] = []
    try:
        with tempfile.TemporaryDirectory(prefix="scalelab-scaling-") as tmp:
            for w in widths:
                for f in fractions:
                    if on_point is not None:
                        on_point(f"width {w}, data {f:g}")
                    points.append(train_point(cfg, data, pre, width=w, fraction=f,
                                              run_dir=Path(tmp)))
    finally:
        torch.set_num_threads(previous)
    fit, err, plan = fit_and_plan(points, budget)
    return ScalingLawResult(points=points, fit=fit, fit_error=err, plan=plan,
                            frontier=_frontier(points))


def grid_records(result: ScalingLawResult) -> list[Record]:
    """One record per grid point (stage train.scaling_law; variable: compute, 6ND FLOP)."""
    exp = new_experiment_id("train-scaling-law")
    return [make_record(
        experiment=exp, stage="train.scaling_law", variable="compute_flops",
        level=p.flops_6nd, repeat=i, input_volume=float(p.samples), input_unit="samples",
        wall_s=p.wall_s, quality={"test_loss": p.test_loss, "accuracy": p.accuracy},
        extras={"width": p.width, "fraction": p.fraction, "n_params": p.n_params,
                "measured_flops": p.flops}) for i, p in enumerate(result.points)]


def curves(points: list[GridPoint]) -> dict[str, Any]:
    """Learning curves: loss vs data per width, loss vs params per data fraction."""
    by_width: dict[int, list[list[float]]] = {}
    by_data: dict[float, list[list[float]]] = {}
    for p in points:
        by_width.setdefault(p.width, []).append([p.samples, p.test_loss])
        by_data.setdefault(p.fraction, []).append([p.n_params, p.test_loss])
    return {"loss_vs_data": {str(k): sorted(v) for k, v in by_width.items()},
            "loss_vs_params": {str(k): sorted(v) for k, v in by_data.items()},
            "loss_vs_flops": sorted([p.flops, p.test_loss] for p in points)}
