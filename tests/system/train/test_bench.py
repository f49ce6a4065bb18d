from __future__ import annotations

import pytest

from scalelab.system.train.bench import Level, _verdict, limiting_resource
from scalelab.system.train.scaling_law import GridPoint, _frontier, fit_and_plan


def test_limiting_resource_names_the_cause() -> None:
    assert limiting_resource(world=4, threads=1, cores=2, comm_share=0.1) == "cpu: 2 cores"
    assert limiting_resource(world=2, threads=1, cores=2, comm_share=0.7) == \
        "communication: gloo all-reduce"
    assert limiting_resource(world=2, threads=1, cores=2, comm_share=0.2) == "cpu: 2 cores"
    assert limiting_resource(world=1, threads=1, cores=2, comm_share=0.0) == "cpu compute"


def _lv(n: int, x: float, limit: str) -> Level:
    return Level(nproc=n, threads=1, global_batch=512, samples_per_s=x, speedup=x / 100,
                 efficiency=x / 100 / n, karp_flatt=None, comm_share=0.1,
                 phase_ms_per_step={}, limiting_resource=limit)


def test_verdict_names_the_resource_past_the_peak() -> None:
    peak, text = _verdict([_lv(1, 100, "cpu compute"), _lv(2, 180, "cpu: 2 cores"),
                           _lv(4, 120, "cpu: 2 cores")], "strong")
    assert peak == 2
    assert "peaks at 2 process(es)" in text and "beyond it the limit is cpu: 2 cores" in text


def _point(n: int, d: int, loss: float) -> GridPoint:
    return GridPoint(width=n, fraction=d / 1000, n_params=n, samples=d, flops=6.0 * n * d,
                     flops_6nd=6.0 * n * d, test_loss=loss, train_loss=loss, accuracy=0.5,
                     wall_s=1.0)


def test_law_fit_and_plan_recover_a_known_law() -> None:
    e, a, b, alpha, beta = 0.5, 20.0, 40.0, 0.4, 0.35
    pts = [_point(n, d, e + a / n**alpha + b / d**beta)
           for n in (1000, 3000, 10000, 30000) for d in (10**4, 10**5, 10**6)]
    fit, err, plan = fit_and_plan(pts, budget=1e12)
    assert err is None and fit is not None and plan is not None
    assert fit.alpha == pytest.approx(alpha, rel=0.05)
    assert fit.beta == pytest.approx(beta, rel=0.05)
    assert plan.budget_flops == 1e12 and plan.n_opt * plan.d_opt * 6 == pytest.approx(1e12)
    assert plan.dloss_per_gflop < 0 and plan.dloss_per_doubling < 0
    assert plan.best_measured.flops_6nd <= 1e12


def test_frontier_keeps_only_improvements() -> None:
    pts = [_point(1, 10, 1.0), _point(2, 10, 1.2), _point(4, 10, 0.9), _point(8, 10, 0.95)]
    assert [p.n_params for p in _frontier(pts)] == [1, 4]


def test_grid_records_one_per_point_on_the_compute_axis() -> None:
    from scalelab.system.train.scaling_law import ScalingLawResult, grid_records

    pts = [GridPoint(width=w, fraction=f, n_params=10 * w, samples=100, flops=7.0e3 * w,
                     flops_6nd=6.0e3 * w, test_loss=1.0 / w, train_loss=0.9, accuracy=0.5,
                     wall_s=2.0) for w, f in ((4, 0.5), (8, 1.0))]
    recs = grid_records(ScalingLawResult(points=pts, fit=None, fit_error="x", plan=None,
                                         frontier=pts))
    assert [(r.stage, r.variable, r.level, r.repeat) for r in recs] == [
        ("train.scaling_law", "compute_flops", 24000.0, 0),
        ("train.scaling_law", "compute_flops", 48000.0, 1)]
    assert recs[1].quality == {"test_loss": 0.125, "accuracy": 0.5}
    assert recs[1].extras == {"width": 8, "fraction": 1.0, "n_params": 80,
                              "measured_flops": 56000.0}
    assert len({r.experiment for r in recs}) == 1
