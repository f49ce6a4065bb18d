"""What the Kubernetes HorizontalPodAutoscaler would decide, as a pure function.

A model of the controller in kubernetes/kubernetes pkg/controller/podautoscaler (horizontal.go,
replica_calculator.go, metrics/utilization.go), kept faithful down to its integer arithmetic
(milli-values, the truncated utilization percentage) because that arithmetic decides the edge
cases. One sync of the controller is:

1. Guards: a target scaled to 0 with min > 0 is left alone (ScalingDisabled); a replica count
   outside [min, max] is brought to the nearest bound.
2. Per metric, the replica calculator: group the pods (failed and deleted ignored; pending, and
   for CPU not-yet-ready ones, unready; those without a sample missing), usage ratio =
   current / target over the ready pods with samples; within tolerance (per direction:
   1 - down <= ratio <= 1 + up) keep the current count, else ceil(ratio × ready pods). With
   missing or unready pods it fills them in (missing: 100% of request, or the target, on a
   scale-down and 0 on a scale-up; unready: 0 on a scale-up), recomputes the ratio, and cancels
   a scale that would reverse direction or fall within tolerance. Several metrics: the largest
   proposal wins; a scale-down with any metric failing is refused.
3. Normalisation. Without `behavior`: the largest recommendation of the last 300 s
   (--horizontal-pod-autoscaler-downscale-stabilization), then clamp to [min, max(2 × current, 4)]
   (scaleUpLimitFactor 2.0, scaleUpLimitMinimum 4.0). With `behavior`: stabilise between the
   smallest recommendation in the scale-up window and the largest in the scale-down window, then
   limit the change per the Pods/Percent policies over their periodSeconds using the recent
   scale events (selectPolicy Max, Min or Disabled), then [min, max].

Pure use: `decide(HpaState(spec=..., current_replicas=..., pods=..., recommendations=...,
scale_events=...), now_s) -> SyncDecision`, with every intermediate number on the SyncDecision.

Stepping in simulated time (the autoscaling simulator does this)::

    hpa = HpaController(HpaSpec(min_replicas=1, max_replicas=20,
                                metrics=(MetricTarget(name="cpu", target=60),)))
    for t in range(0, 600):                        # any clock in seconds
        d = hpa.step(t, replicas, pods)            # None unless a sync is due (every 15 s)
        if d is not None and d.rescale:
            replicas = d.desired_replicas          # the controller assumes the scale succeeded

`HpaController` keeps the recommendations and scale events between syncs, exactly as the
controller keeps them in memory; `sync()` forces one regardless of the period.
"""

from __future__ import annotations

from scalelab.lab.autoscale.hpa.controller import (
    HpaController,
    decide,
)
from scalelab.lab.autoscale.hpa.decision import (
    MetricResult,
    SyncDecision,
)
from scalelab.lab.autoscale.hpa.json_state import (
    spec_from_json,
    state_from_json,
)
from scalelab.lab.autoscale.hpa.normalization import (
    SCALE_UP_LIMIT_FACTOR,
    SCALE_UP_LIMIT_MINIMUM,
)
from scalelab.lab.autoscale.hpa.spec import (
    DEFAULT_SCALE_DOWN_POLICIES,
    DEFAULT_SCALE_UP_POLICIES,
    SOURCES,
    TARGET_TYPES,
    Behavior,
    ControllerConfig,
    HpaSpec,
    MetricTarget,
    ScalingPolicy,
    ScalingRules,
)
from scalelab.lab.autoscale.hpa.state import (
    PHASES,
    HpaState,
    PodSample,
    Recommendation,
    ScaleEvent,
)

__all__ = [
    "DEFAULT_SCALE_DOWN_POLICIES",
    "DEFAULT_SCALE_UP_POLICIES",
    "PHASES",
    "SCALE_UP_LIMIT_FACTOR",
    "SCALE_UP_LIMIT_MINIMUM",
    "SOURCES",
    "TARGET_TYPES",
    "Behavior",
    "ControllerConfig",
    "HpaController",
    "HpaSpec",
    "HpaState",
    "MetricResult",
    "MetricTarget",
    "PodSample",
    "Recommendation",
    "ScaleEvent",
    "ScalingPolicy",
    "ScalingRules",
    "SyncDecision",
    "decide",
    "spec_from_json",
    "state_from_json",
]
