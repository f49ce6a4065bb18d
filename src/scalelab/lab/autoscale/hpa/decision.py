"""One sync's outcome: the decision and what the replica calculator made of each metric."""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.lab.autoscale.hpa.state import Recommendation


@dataclass(frozen=True, kw_only=True)
class MetricResult:
    """What the replica calculator made of one metric."""

    metric: str
    target: float
    current: float | None
    """As the controller reports it: utilization percent, average or total value."""
    usage_ratio: float | None
    recomputed_ratio: float | None
    """The ratio after filling in missing/unready pods; None when there were none to fill."""
    proposal: int | None
    """Replicas this metric asks for; None when it could not be computed."""
    outcome: str
    """Scale, WithinTolerance, DirectionReversed, or FailedGet<Source>Metric."""
    ready_pods: int = 0
    unready_pods: tuple[str, ...] = ()
    missing_pods: tuple[str, ...] = ()
    ignored_pods: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class SyncDecision:
    """One sync's outcome and the numbers behind it."""

    now_s: float
    current_replicas: int
    desired_replicas: int
    rescale: bool
    reason: str
    """The rule that decided: DesiredWithinRange, WithinTolerance, DirectionReversed,
    ScaleUpStabilized, ScaleDownStabilized, ScaleUpLimit, ScaleDownLimit, TooManyReplicas,
    TooFewReplicas, AboveMaxReplicas, BelowMinReplicas, ScalingDisabled, FailedGet...Metric."""
    message: str
    usage_ratio: float | None
    """The usage ratio of the metric that won (the largest proposal)."""
    proposal: int | None
    """The metrics' desired replicas before normalisation (what gets recorded)."""
    stabilized: int | None
    limited: int | None
    metric: str | None
    able_to_scale: str
    scaling_limited: str
    """The ScalingLimited condition's reason (DesiredWithinRange when not limited)."""
    tolerances: tuple[float, float]
    """(scale-down, scale-up)."""
    metrics: tuple[MetricResult, ...] = ()
    recommendation: Recommendation | None = None
    """What the controller records for future stabilisation (None when it records nothing)."""
