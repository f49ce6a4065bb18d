"""How often to checkpoint a long job: Young's and Daly's intervals and what each costs.

δ is the time to write one checkpoint, M the mean time between failures (MTBF), R the time to
restart after a failure (reload, requeue), T_s the job's failure-free compute time.

- Young (1974): τ = sqrt(2δM), first order in δ/M.
- Daly (2006), the higher-order estimate: τ = sqrt(2δM)·[1 + ⅓·sqrt(δ/(2M)) + (1/9)·(δ/(2M))] − δ
  for δ < 2M, else τ = M.
- Daly's expected wall-clock time for exponentially distributed failures:
  T_w(τ) = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ. Each of the T_s/τ segments of τ work plus a δ write
  takes E = M·e^{R/M}·(e^{(τ+δ)/M} − 1) on average; of that, τ is useful, δ is the checkpoint
  that finally succeeds, and E − τ − δ is lost to failures (rework, restarts, interrupted writes).
  The fraction lost is 1 − T_s/T_w = 1 − τ/E, independent of T_s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.lab.core.errors import BadInputError


def _positive(v: float, what: str) -> None:
    if not (math.isfinite(v) and v > 0):
        raise BadInputError(f"{what} must be a positive duration (got {v} s)")


def young_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Young's interval sqrt(2δM), in seconds of compute between checkpoints."""
    _positive(save_cost_s, "checkpoint save cost")
    _positive(mtbf_s, "MTBF")
    return math.sqrt(2.0 * save_cost_s * mtbf_s)


def daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order interval; M itself once the save cost reaches 2M."""
    _positive(save_cost_s, "checkpoint save cost")
    _positive(mtbf_s, "MTBF")
    if save_cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_cost_s / (2.0 * mtbf_s)
    return (math.sqrt(2.0 * save_cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0)
            - save_cost_s)


def segment_time(interval_s: float, save_cost_s: float, mtbf_s: float,
                 restart_s: float = 0.0) -> float:
    """Expected wall time E to complete one segment (τ of work plus its checkpoint)."""
    _positive(interval_s, "checkpoint interval")
    _positive(save_cost_s, "checkpoint save cost")
    _positive(mtbf_s, "MTBF")
    if not (math.isfinite(restart_s) and restart_s >= 0):
        raise BadInputError(f"restart time must be >= 0 (got {restart_s} s)")
    # expm1 keeps precision when (τ+δ)/M is small, the common case.
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_cost_s) / mtbf_s)


def expected_wall_time(work_s: float, interval_s: float, save_cost_s: float, mtbf_s: float,
                       restart_s: float = 0.0) -> float:
    """Daly's T_w for `work_s` seconds of failure-free compute."""
    _positive(work_s, "work")
    return segment_time(interval_s, save_cost_s, mtbf_s, restart_s) * work_s / interval_s


@dataclass(frozen=True, kw_only=True)
class IntervalCost:
    """One checkpoint interval and where the wall time goes under Daly's model."""

    method: str
    interval_s: float
    lost_fraction: float
    """1 − T_s/T_w: the share of wall time that is not useful compute."""
    checkpoint_fraction: float
    """Share of wall time spent writing checkpoints that completed."""
    failure_fraction: float
    """Share lost to failures: rework, restarts and interrupted checkpoint writes."""
    wall_time_s: float | None
    """Expected wall time for the whole work (when `work_s` was given)."""
    checkpoints: float | None
    """Expected number of completed checkpoints over the work: T_s/τ."""
    failures: float | None
    """Expected number of failures over the wall time: T_w/M."""


@dataclass(frozen=True, kw_only=True)
class CheckpointPlan:
    save_cost_s: float
    mtbf_s: float
    restart_s: float
    work_s: float | None
    young: IntervalCost
    daly: IntervalCost


def interval_cost(method: str, interval_s: float, save_cost_s: float, mtbf_s: float,
                  restart_s: float = 0.0, work_s: float | None = None) -> IntervalCost:
    """Where the time goes when checkpointing every `interval_s` of compute."""
    e = segment_time(interval_s, save_cost_s, mtbf_s, restart_s)
    wall = None if work_s is None else expected_wall_time(work_s, interval_s, save_cost_s,
                                                          mtbf_s, restart_s)
    return IntervalCost(
        method=method, interval_s=interval_s, lost_fraction=1.0 - interval_s / e,
        checkpoint_fraction=save_cost_s / e, failure_fraction=(e - interval_s - save_cost_s) / e,
        wall_time_s=wall, checkpoints=None if work_s is None else work_s / interval_s,
        failures=None if wall is None else wall / mtbf_s)


def plan_checkpoints(save_cost_s: float, mtbf_s: float, restart_s: float = 0.0,
                     work_s: float | None = None) -> CheckpointPlan:
    """Young's and Daly's intervals with the time each loses; `scalelab plan checkpoint`."""
    return CheckpointPlan(
        save_cost_s=save_cost_s, mtbf_s=mtbf_s, restart_s=restart_s, work_s=work_s,
        young=interval_cost("young", young_interval(save_cost_s, mtbf_s), save_cost_s, mtbf_s,
                            restart_s, work_s),
        daly=interval_cost("daly", daly_interval(save_cost_s, mtbf_s), save_cost_s, mtbf_s,
                           restart_s, work_s))
