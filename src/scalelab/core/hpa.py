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
scale_events=...), now_s) -> Decision`, with every intermediate number on the Decision.

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

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from scalelab.core.errors import BadInputError

SOURCES = ("Resource", "Pods", "Object", "External")
TARGET_TYPES = {
    "Resource": ("Utilization", "AverageValue"),
    "Pods": ("AverageValue",),
    "Object": ("Value", "AverageValue"),
    "External": ("Value", "AverageValue"),
}
PHASES = ("Running", "Pending", "Succeeded", "Failed", "Unknown")
SCALE_UP_LIMIT_FACTOR = 2.0
SCALE_UP_LIMIT_MINIMUM = 4.0
_INT32_MAX = 2**31 - 1


def _milli(v: float) -> int:
    """Quantity.MilliValue(): ceil(v × 1000); rounded first so 0.9 is 900m, not 901m."""
    return math.ceil(round(v * 1000.0, 6))


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise BadInputError(msg)


def _finite(v: float) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int_in(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


@dataclass(frozen=True, kw_only=True)
class MetricTarget:
    """One entry of spec.metrics: what to measure and the value to hold it at."""

    name: str = "cpu"
    """Resource name (cpu, memory) for Resource; the metric's name otherwise."""
    source: str = "Resource"
    """Resource, Pods (a per-pod custom metric), Object or External (one value, not per pod)."""
    target_type: str = "Utilization"
    """Utilization (percent of the pods' requests), AverageValue (per pod) or Value (total)."""
    target: float
    """The target: an integer percent for Utilization, else a value in the metric's unit."""

    def __post_init__(self) -> None:
        _check(self.source in SOURCES,
               f"metric {self.name!r}: source {self.source!r} is not one of {', '.join(SOURCES)}")
        allowed = TARGET_TYPES[self.source]
        _check(self.target_type in allowed,
               f"metric {self.name!r}: a {self.source} metric takes target type "
               f"{' or '.join(allowed)}, not {self.target_type!r}")
        _check(bool(self.name), "metric name must not be empty")
        if self.target_type == "Utilization":
            _check(_finite(self.target) and self.target >= 1 and float(self.target).is_integer(),
                   f"metric {self.name!r}: Utilization target must be a whole percent >= 1 "
                   f"(got {self.target}); e.g. 60")
        else:
            _check(_finite(self.target) and _milli(self.target) > 0,
                   f"metric {self.name!r}: target must be > 0 (got {self.target})")

    @property
    def label(self) -> str:
        if self.source == "Resource" and self.target_type == "Utilization":
            return f"{self.name} resource utilization (percentage of request)"
        return f"{self.name} ({self.source.lower()} metric, {self.target_type})"


@dataclass(frozen=True, kw_only=True)
class PodSample:
    """One pod the HPA's selector matches, with its status and its latest metric samples."""

    name: str
    phase: str = "Running"
    """Running, Pending, Succeeded, Failed or Unknown (status.phase)."""
    deleted: bool = False
    """Has a deletionTimestamp (terminating): ignored, like a Failed pod."""
    ready: bool | None = True
    """The PodReady condition; None when the pod reports no such condition (counts as unready)."""
    start_s: float | None = None
    """status.startTime on the decision clock; None means long ago (outside any init period)."""
    ready_changed_s: float | None = None
    """lastTransitionTime of PodReady; None means at start (a not-ready pod was never ready)."""
    usage: Mapping[str, float] = field(default_factory=dict)
    """Latest sample per metric name (cpu in cores, ...); absent means no sample (missing)."""
    requests: Mapping[str, float] = field(default_factory=dict)
    """Resource requests summed over the pod's containers, per resource name."""
    sampled_s: float | None = None
    """When the samples were taken; None means now."""

    def __post_init__(self) -> None:
        _check(bool(self.name), "pod name must not be empty")
        _check(self.phase in PHASES,
               f"pod {self.name!r}: phase {self.phase!r} is not one of {', '.join(PHASES)}")
        for what, m in (("usage", self.usage), ("requests", self.requests)):
            for k, v in m.items():
                _check(_finite(v) and v >= 0,
                       f"pod {self.name!r}: {what}[{k!r}] must be a finite number >= 0 (got {v})")


@dataclass(frozen=True, kw_only=True)
class ScalingPolicy:
    """One rate limit: change by at most `value` pods (or percent) per `period_s`."""

    type: str
    """Pods or Percent."""
    value: int
    period_s: int
    """periodSeconds, 1..1800."""

    def __post_init__(self) -> None:
        _check(self.type in ("Pods", "Percent"),
               f"policy type {self.type!r} must be Pods or Percent")
        _check(_int_in(self.value, 1, _INT32_MAX),
               f"policy value must be an integer > 0 (got {self.value})")
        _check(_int_in(self.period_s, 1, 1800),
               f"policy periodSeconds must be an integer in 1..1800 (got {self.period_s})")


@dataclass(frozen=True, kw_only=True)
class ScalingRules:
    """behavior.scaleUp or behavior.scaleDown; None fields take the API's defaults."""

    stabilization_window_s: int | None = None
    """stabilizationWindowSeconds (0..3600); None: 0 up, the controller's 300 s down."""
    select_policy: str = "Max"
    """Max (the policy allowing the biggest change), Min, or Disabled (no scaling this way)."""
    policies: tuple[ScalingPolicy, ...] | None = None
    """None: up, 4 pods or 100% per 15 s; down, 100% per 15 s."""
    tolerance: float | None = None
    """Tolerance for this direction (HPAConfigurableTolerance); None: the controller's 0.1."""

    def __post_init__(self) -> None:
        w = self.stabilization_window_s
        _check(w is None or _int_in(w, 0, 3600),
               f"stabilizationWindowSeconds must be an integer in 0..3600 (got {w})")
        _check(self.select_policy in ("Max", "Min", "Disabled"),
               f"selectPolicy {self.select_policy!r} must be Max, Min or Disabled")
        _check(self.policies is None or len(self.policies) > 0,
               "policies must list at least one policy (or be left out for the defaults)")
        t = self.tolerance
        _check(t is None or (_finite(t) and t >= 0), f"tolerance must be >= 0 (got {t})")


DEFAULT_SCALE_UP_POLICIES = (ScalingPolicy(type="Pods", value=4, period_s=15),
                             ScalingPolicy(type="Percent", value=100, period_s=15))
DEFAULT_SCALE_DOWN_POLICIES = (ScalingPolicy(type="Percent", value=100, period_s=15),)


@dataclass(frozen=True, kw_only=True)
class Behavior:
    """spec.behavior. Setting it (even empty) switches from the max(2×, 4) limit to policies."""

    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    """The kube-controller-manager flags the decision depends on (their defaults)."""

    tolerance: float = 0.1
    """--horizontal-pod-autoscaler-tolerance."""
    downscale_stabilization_s: float = 300.0
    """--horizontal-pod-autoscaler-downscale-stabilization."""
    cpu_initialization_period_s: float = 300.0
    """--horizontal-pod-autoscaler-cpu-initialization-period."""
    initial_readiness_delay_s: float = 30.0
    """--horizontal-pod-autoscaler-initial-readiness-delay."""
    sync_period_s: float = 15.0
    """--horizontal-pod-autoscaler-sync-period (used by HpaController only)."""
    metric_window_s: float = 15.0
    """The window of a CPU sample (metrics-server's default resolution)."""

    def __post_init__(self) -> None:
        _check(_finite(self.tolerance) and self.tolerance >= 0,
               f"tolerance must be >= 0 (got {self.tolerance})")
        for name in ("downscale_stabilization_s", "cpu_initialization_period_s",
                     "initial_readiness_delay_s", "metric_window_s"):
            v = getattr(self, name)
            _check(_finite(v) and v >= 0, f"{name} must be >= 0 (got {v})")
        _check(_finite(self.sync_period_s) and self.sync_period_s > 0,
               f"sync_period_s must be > 0 (got {self.sync_period_s})")


@dataclass(frozen=True, kw_only=True)
class HpaSpec:
    """The HorizontalPodAutoscaler object (what does not change between syncs)."""

    min_replicas: int = 1
    max_replicas: int
    metrics: tuple[MetricTarget, ...]
    behavior: Behavior | None = None
    controller: ControllerConfig = field(default_factory=ControllerConfig)

    def __post_init__(self) -> None:
        _check(_int_in(self.max_replicas, 1, _INT32_MAX),
               f"max_replicas must be an integer >= 1 (got {self.max_replicas})")
        _check(_int_in(self.min_replicas, 0, self.max_replicas),
               f"min_replicas must be an integer in 0..max_replicas={self.max_replicas} "
               f"(got {self.min_replicas})")
        _check(len(self.metrics) > 0, "metrics must list at least one metric target")
        _check(self.min_replicas > 0 or any(m.source in ("Object", "External")
                                            for m in self.metrics),
               "min_replicas 0 (scale to zero) needs an Object or External metric")

    def tolerances(self) -> tuple[float, float]:
        """(scale-down, scale-up) tolerance: behavior's per-direction value, else the flag."""
        down = up = self.controller.tolerance
        if self.behavior is not None:
            if self.behavior.scale_down and self.behavior.scale_down.tolerance is not None:
                down = self.behavior.scale_down.tolerance
            if self.behavior.scale_up and self.behavior.scale_up.tolerance is not None:
                up = self.behavior.scale_up.tolerance
        return down, up

    def rules(self) -> tuple[ScalingRules, ScalingRules]:
        """(scale-up, scale-down) rules with the default policies filled in (see `windows`)."""
        b = self.behavior or Behavior()
        up, down = b.scale_up or ScalingRules(), b.scale_down or ScalingRules()
        return (replace(up, policies=up.policies or DEFAULT_SCALE_UP_POLICIES),
                replace(down, policies=down.policies or DEFAULT_SCALE_DOWN_POLICIES))

    def windows(self) -> tuple[float, float]:
        """(scale-up, scale-down) stabilization windows: behavior's, else 0 and the flag."""
        b = self.behavior or Behavior()
        up = b.scale_up.stabilization_window_s if b.scale_up else None
        down = b.scale_down.stabilization_window_s if b.scale_down else None
        return (0.0 if up is None else float(up),
                self.controller.downscale_stabilization_s if down is None else float(down))


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """An unstabilised recommendation the controller made at `time_s`."""

    time_s: float
    replicas: int


@dataclass(frozen=True, kw_only=True)
class ScaleEvent:
    """A scale the controller made at `time_s`: +n pods added, -n removed."""

    time_s: float
    change: int


@dataclass(frozen=True, kw_only=True)
class HpaState:
    """Everything one sync looks at."""

    spec: HpaSpec
    current_replicas: int
    """The scale target's spec.replicas."""
    pods: tuple[PodSample, ...] = ()
    values: Mapping[str, float] = field(default_factory=dict)
    """Observed value per Object/External metric name (the total, not per pod)."""
    recommendations: tuple[Recommendation, ...] = ()
    scale_events: tuple[ScaleEvent, ...] = ()

    def __post_init__(self) -> None:
        _check(_int_in(self.current_replicas, 0, _INT32_MAX),
               f"current_replicas must be an integer >= 0 (got {self.current_replicas})")
        names = [p.name for p in self.pods]
        dup = sorted({n for n in names if names.count(n) > 1})
        _check(not dup, f"pod names must be unique; repeated: {', '.join(dup)}")
        for k, v in self.values.items():
            _check(_finite(v) and v >= 0, f"values[{k!r}] must be a finite number >= 0 (got {v})")


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
class Decision:
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


# ---- the replica calculator -------------------------------------------------------------------

def _within(ratio: float, tol: tuple[float, float]) -> bool:
    return (1.0 - tol[0]) <= ratio <= (1.0 + tol[1])


def _group_pods(pods: Sequence[PodSample], m: MetricTarget, now: float, cfg: ControllerConfig
                ) -> tuple[int, list[str], list[str], list[str], dict[str, int]]:
    """groupPods(): ready count, unready, missing, ignored, and the usable samples (milli)."""
    ready, unready, missing, ignored = 0, [], [], []
    samples: dict[str, int] = {}
    cpu = m.source == "Resource" and m.name == "cpu"
    for p in pods:
        if p.deleted or p.phase == "Failed":
            ignored.append(p.name)
            continue
        if p.phase == "Pending":
            unready.append(p.name)
            continue
        if m.name not in p.usage:
            missing.append(p.name)
            continue
        if cpu:
            sampled = now if p.sampled_s is None else p.sampled_s
            if p.ready is None:
                is_unready = True
            elif p.start_s is not None and p.start_s + cfg.cpu_initialization_period_s > now:
                changed = p.start_s if p.ready_changed_s is None else p.ready_changed_s
                # Inside the init period a sample counts only once a full window was collected
                # after the pod turned ready: start-up CPU bursts would otherwise scale up.
                is_unready = not p.ready or sampled < changed + cfg.metric_window_s
            else:
                never_ready = p.ready_changed_s is None or (
                    p.start_s is not None
                    and p.start_s + cfg.initial_readiness_delay_s > p.ready_changed_s)
                is_unready = not p.ready and never_ready
            if is_unready:
                unready.append(p.name)
                continue
        samples[p.name] = _milli(p.usage[m.name])
        ready += 1
    return ready, unready, missing, ignored, samples


def _utilization(samples: Mapping[str, int], requests: Mapping[str, int], target: int
                 ) -> tuple[float, int]:
    """GetResourceUtilizationRatio(): the percentage is an integer, truncated."""
    total = sum(samples.values())
    req = sum(requests[n] for n in samples)
    if req == 0:
        raise BadInputError("no metrics returned matched known pods (requests sum to 0)")
    current = (total * 100) // req
    return current / target, current


def _average(samples: Mapping[str, int], target: int) -> tuple[float, int]:
    """GetMetricUsageRatio(): integer mean of the milli-values."""
    current = sum(samples.values()) // len(samples)
    return current / target, current


def _pod_metric(state: HpaState, m: MetricTarget, now: float, tol: tuple[float, float]
                ) -> MetricResult:
    """GetResourceReplicas / calcPlainMetricReplicas: Resource and Pods metrics."""
    cur_n = state.current_replicas
    res = MetricResult(metric=m.label, target=m.target, current=None, usage_ratio=None,
                       recomputed_ratio=None, proposal=None, outcome=f"FailedGet{m.source}Metric")
    if not state.pods:
        return replace(res, error="no pods returned by selector while calculating replica count")
    ready, unready, missing, ignored, samples = _group_pods(state.pods, m, now,
                                                            state.spec.controller)
    res = replace(res, ready_pods=ready, unready_pods=tuple(unready),
                  missing_pods=tuple(missing), ignored_pods=tuple(ignored))
    if not samples:
        return replace(res, error="did not receive metrics for targeted pods "
                                  "(pods might be unready)")
    util = m.target_type == "Utilization"
    requests: dict[str, int] = {}
    if util:
        lacking = [p.name for p in state.pods if m.name not in p.requests]
        if lacking:
            return replace(res, error=f"missing request for {m.name} in pod {lacking[0]}")
        requests = {p.name: _milli(p.requests[m.name]) for p in state.pods}
        target = int(m.target)

        def ratio_of(s: Mapping[str, int]) -> tuple[float, int]:
            return _utilization(s, requests, target)
    else:
        target = _milli(m.target)

        def ratio_of(s: Mapping[str, int]) -> tuple[float, int]:
            return _average(s, target)
    try:
        ratio, current = ratio_of(samples)
    except BadInputError as e:
        return replace(res, error=str(e))
    res = replace(res, current=float(current) if util else current / 1000.0, usage_ratio=ratio)

    up_with_unready = bool(unready) and ratio > 1.0
    if not up_with_unready and not missing:
        if _within(ratio, tol):
            return replace(res, proposal=cur_n, outcome="WithinTolerance")
        return replace(res, proposal=math.ceil(ratio * ready), outcome="Scale")

    filled = dict(samples)
    if ratio < 1.0:
        # A scale-down assumes the silent pods are busy (100% of request, or the target when
        # that is higher), so a metrics gap can only make it more cautious.
        fallback = max(100, target)
        for n in missing:
            filled[n] = requests[n] * fallback // 100 if util else target
    elif ratio > 1.0:
        for n in missing:
            filled[n] = 0
    if up_with_unready:
        for n in unready:
            filled[n] = 0
    new_ratio, _ = ratio_of(filled)
    res = replace(res, recomputed_ratio=new_ratio)
    if _within(new_ratio, tol):
        return replace(res, proposal=cur_n, outcome="WithinTolerance")
    if (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return replace(res, proposal=cur_n, outcome="DirectionReversed")
    proposal = math.ceil(new_ratio * len(filled))
    if (new_ratio < 1.0 and proposal > cur_n) or (new_ratio > 1.0 and proposal < cur_n):
        return replace(res, proposal=cur_n, outcome="DirectionReversed")
    return replace(res, proposal=proposal, outcome="Scale")


def _object_metric(state: HpaState, m: MetricTarget, tol: tuple[float, float]) -> MetricResult:
    """GetObjectMetricReplicas / GetExternalMetricReplicas and their per-pod (AverageValue) kin."""
    fail = f"FailedGet{m.source}Metric"
    if m.name not in state.values:
        return MetricResult(metric=m.label, target=m.target, current=None, usage_ratio=None,
                            recomputed_ratio=None, proposal=None, outcome=fail,
                            error=f"no value for {m.source} metric {m.name!r} "
                                  f"(give it under \"values\")")
    usage, target, cur_n = _milli(state.values[m.name]), _milli(m.target), state.current_replicas
    if m.target_type == "AverageValue":
        # The per-pod form divides by status.replicas; with none, Go's float division gives
        # +Inf or NaN, neither within tolerance, so the count is recomputed.
        denom = float(target) * cur_n
        ratio = usage / denom if denom else (math.inf if usage else math.nan)
        within = _within(ratio, tol)
        proposal = cur_n if within else math.ceil(usage / target)
        current = math.ceil(usage / cur_n) / 1000.0 if cur_n else None
        return MetricResult(metric=m.label, target=m.target, current=current,
                            usage_ratio=ratio if math.isfinite(ratio) else None,
                            recomputed_ratio=None, proposal=proposal,
                            outcome="WithinTolerance" if within else "Scale")
    ratio = usage / target
    # getReadyPodsCount(): Running and Ready; unlike groupPods it does not skip terminating pods.
    ready = sum(1 for p in state.pods if p.phase == "Running" and p.ready)
    if cur_n == 0:
        proposal, outcome = math.ceil(ratio), "Scale"
    elif _within(ratio, tol):
        proposal, outcome = cur_n, "WithinTolerance"
    elif not state.pods:
        return MetricResult(metric=m.label, target=m.target, current=usage / 1000.0,
                            usage_ratio=ratio, recomputed_ratio=None, proposal=None,
                            outcome=fail, error="unable to calculate ready pods: no pods "
                                                "returned by selector")
    else:
        proposal, outcome = min(math.ceil(ratio * ready), _INT32_MAX), "Scale"
    return MetricResult(metric=m.label, target=m.target, current=usage / 1000.0,
                        usage_ratio=ratio, recomputed_ratio=None, proposal=proposal,
                        outcome=outcome, ready_pods=ready)


# ---- normalisation ----------------------------------------------------------------------------

def _changes_in_period(events: Sequence[ScaleEvent], period_s: int, now: float
                       ) -> tuple[int, int]:
    cutoff = now - period_s
    added = sum(e.change for e in events if e.time_s > cutoff and e.change > 0)
    removed = sum(-e.change for e in events if e.time_s > cutoff and e.change < 0)
    return added, removed


def _scale_up_limit(current: int, events: Sequence[ScaleEvent], rules: ScalingRules,
                    now: float) -> int:
    """calculateScaleUpLimitWithScalingRules()."""
    if rules.select_policy == "Disabled":
        return current
    # selectPolicy Min picks the smallest increase; Max (the default) the largest.
    proposals: list[int] = []
    for p in rules.policies or ():
        added, removed = _changes_in_period(events, p.period_s, now)
        start = current - added + removed
        proposals.append(start + p.value if p.type == "Pods"
                         else math.ceil(start * (1 + p.value / 100)))
    return min(proposals) if rules.select_policy == "Min" else max(proposals)


def _scale_down_limit(current: int, events: Sequence[ScaleEvent], rules: ScalingRules,
                      now: float) -> int:
    """calculateScaleDownLimitWithBehaviors(); Percent truncates (int32 conversion)."""
    if rules.select_policy == "Disabled":
        return current
    # For a scale-down the smallest change (Min) is the highest replica count.
    proposals: list[int] = []
    for p in rules.policies or ():
        added, removed = _changes_in_period(events, p.period_s, now)
        start = current - added + removed
        proposals.append(start - p.value if p.type == "Pods"
                         else int(start * (1 - p.value / 100)))
    return max(proposals) if rules.select_policy == "Min" else min(proposals)


def _normalize_plain(state: HpaState, desired: int, now: float) -> tuple[int, int, str, str, str]:
    """normalizeDesiredReplicas(): stabilise over the downscale window, then min/max(2×, 4)."""
    spec, cur = state.spec, state.current_replicas
    cutoff = now - spec.controller.downscale_stabilization_s
    stabilized = max([desired] + [r.replicas for r in state.recommendations
                                  if not r.time_s < cutoff])
    able = "ScaleDownStabilized" if stabilized != desired else "ReadyForNewScale"
    scale_up_limit = int(max(SCALE_UP_LIMIT_FACTOR * cur, SCALE_UP_LIMIT_MINIMUM))
    if spec.max_replicas > scale_up_limit:
        hi, hi_reason = scale_up_limit, "ScaleUpLimit"
    else:
        hi, hi_reason = spec.max_replicas, "TooManyReplicas"
    if stabilized < spec.min_replicas:
        return stabilized, spec.min_replicas, "TooFewReplicas", able, (
            "the desired replica count is less than the minimum replica count")
    if stabilized > hi:
        return stabilized, hi, hi_reason, able, (
            "the desired replica count is increasing faster than the maximum scale rate"
            if hi_reason == "ScaleUpLimit"
            else "the desired replica count is more than the maximum replica count")
    return stabilized, stabilized, "DesiredWithinRange", able, (
        "the desired count is within the acceptable range")


def _normalize_behavior(state: HpaState, desired: int, now: float
                        ) -> tuple[int, int, str, str, str]:
    """normalizeDesiredReplicasWithBehaviors(): stabilise in both windows, then rate-limit."""
    spec, cur = state.spec, state.current_replicas
    up_rules, down_rules = spec.rules()
    up_window, down_window = spec.windows()
    up_cut, down_cut = now - up_window, now - down_window
    up_rec = min([desired] + [r.replicas for r in state.recommendations if r.time_s > up_cut])
    down_rec = max([desired] + [r.replicas for r in state.recommendations if r.time_s > down_cut])
    stabilized = min(max(cur, up_rec), down_rec)
    able = ("ReadyForNewScale" if stabilized == desired
            else "ScaleUpStabilized" if desired >= cur else "ScaleDownStabilized")
    events = state.scale_events
    if stabilized > cur:
        limit = max(_scale_up_limit(cur, events, up_rules, now), cur)
        if spec.max_replicas > limit:
            hi, why = limit, "ScaleUpLimit"
            msg = "the desired replica count is increasing faster than the maximum scale rate"
        else:
            hi, why = spec.max_replicas, "TooManyReplicas"
            msg = "the desired replica count is more than the maximum replica count"
        if stabilized > hi:
            return stabilized, hi, why, able, msg
    elif stabilized < cur:
        limit = min(_scale_down_limit(cur, events, down_rules, now), cur)
        if spec.min_replicas < limit:
            lo, why = limit, "ScaleDownLimit"
            msg = "the desired replica count is decreasing faster than the maximum scale rate"
        else:
            lo, why = spec.min_replicas, "TooFewReplicas"
            msg = "the desired replica count is less than the minimum replica count"
        if stabilized < lo:
            return stabilized, lo, why, able, msg
    return stabilized, stabilized, "DesiredWithinRange", able, (
        "the desired count is within the acceptable range")


# ---- one sync ---------------------------------------------------------------------------------

def decide(state: HpaState, now_s: float) -> Decision:
    """One reconcile of the HPA at time `now_s` (same clock as the state's timestamps)."""
    spec, cur = state.spec, state.current_replicas
    tol = spec.tolerances()
    d = Decision(now_s=now_s, current_replicas=cur, desired_replicas=cur, rescale=False,
                 reason="", message="", usage_ratio=None, proposal=None, stabilized=None,
                 limited=None, metric=None, able_to_scale="ReadyForNewScale",
                 scaling_limited="DesiredWithinRange", tolerances=tol)
    if cur == 0 and spec.min_replicas != 0:
        return replace(d, desired_replicas=0, reason="ScalingDisabled",
                       message="scaling is disabled since the replica count of the target is zero")
    if cur > spec.max_replicas:
        return replace(d, desired_replicas=spec.max_replicas, rescale=True,
                       reason="AboveMaxReplicas",
                       message="Current number of replicas above Spec.MaxReplicas")
    if cur < spec.min_replicas:
        return replace(d, desired_replicas=spec.min_replicas, rescale=True,
                       reason="BelowMinReplicas",
                       message="Current number of replicas below Spec.MinReplicas")

    results = tuple(
        _object_metric(state, m, tol) if m.source in ("Object", "External")
        else _pod_metric(state, m, now_s, tol)
        for m in spec.metrics)
    d = replace(d, metrics=results)
    best: MetricResult | None = None
    for r in results:
        if r.proposal is not None and (best is None or r.proposal > (best.proposal or 0)):
            best = r
    failed = [r for r in results if r.proposal is None]
    if best is None or best.proposal is None or (failed and best.proposal < cur):
        # All metrics failed, or some did and the rest would scale down: hold (computeReplicas-
        # ForMetrics refuses to shrink on partial information).
        first = failed[0]
        return replace(d, reason=first.outcome,
                       message=f"the HPA was unable to compute the replica count: "
                               f"{first.metric}: {first.error}")
    proposal = best.proposal
    normalize = _normalize_plain if spec.behavior is None else _normalize_behavior
    stabilized, limited, limit_reason, able, limit_msg = normalize(state, proposal, now_s)
    if limited != stabilized:
        reason, message = limit_reason, limit_msg
    elif stabilized != proposal:
        reason = able
        message = ("recent recommendations were higher than current one, applying the highest "
                   "recent recommendation" if able == "ScaleDownStabilized" else
                   "recent recommendations were lower than current one, applying the lowest "
                   "recent recommendation")
    elif proposal == cur and best.outcome in ("WithinTolerance", "DirectionReversed"):
        reason = best.outcome
        message = (f"{best.metric}: usage ratio within tolerance "
                   f"[{1 - tol[0]:g}, {1 + tol[1]:g}]" if reason == "WithinTolerance" else
                   f"{best.metric}: counting missing/unready pods reverses the scale direction")
    else:
        reason = "DesiredWithinRange"
        message = (f"{best.metric} above target" if limited > cur
                   else "All metrics below target" if limited < cur
                   else "the desired count is within the acceptable range")
    return replace(d, desired_replicas=limited, rescale=limited != cur, reason=reason,
                   message=message, usage_ratio=best.usage_ratio, proposal=proposal,
                   stabilized=stabilized, limited=limited, metric=best.metric,
                   able_to_scale=able, scaling_limited=limit_reason,
                   recommendation=Recommendation(time_s=now_s, replicas=proposal))


class HpaController:
    """The controller's memory across syncs: recommendations and scale events, in one clock."""

    def __init__(self, spec: HpaSpec) -> None:
        self.spec = spec
        self.recommendations: list[Recommendation] = []
        self.scale_events: list[ScaleEvent] = []
        self.last_sync_s: float | None = None
        self.last: Decision | None = None

    def due(self, now_s: float) -> bool:
        """Whether a sync is due: the first call, then every sync_period_s."""
        return (self.last_sync_s is None
                or now_s >= self.last_sync_s + self.spec.controller.sync_period_s)

    def step(self, now_s: float, current_replicas: int, pods: Sequence[PodSample] = (),
             values: Mapping[str, float] | None = None) -> Decision | None:
        """Sync if one is due at `now_s`, else None. Pods and values as in `HpaState`."""
        if not self.due(now_s):
            return None
        return self.sync(now_s, current_replicas, pods, values)

    def sync(self, now_s: float, current_replicas: int, pods: Sequence[PodSample] = (),
             values: Mapping[str, float] | None = None) -> Decision:
        """One reconcile now; records what the controller records and assumes the scale ran."""
        if self.last_sync_s is not None and now_s < self.last_sync_s:
            raise BadInputError(
                f"time went backwards: sync at {now_s} s after one at {self.last_sync_s} s")
        state = HpaState(spec=self.spec, current_replicas=current_replicas, pods=tuple(pods),
                         values=dict(values or {}), recommendations=tuple(self.recommendations),
                         scale_events=tuple(self.scale_events))
        d = decide(state, now_s)
        if d.recommendation is not None:
            self.recommendations.append(d.recommendation)
        # Only a spec with behavior keeps scale events (storeScaleEvent returns early otherwise).
        if d.rescale and self.spec.behavior is not None:
            self.scale_events.append(ScaleEvent(time_s=now_s,
                                                change=d.desired_replicas - current_replicas))
        self._forget(now_s)
        self.last_sync_s, self.last = now_s, d
        return d

    def _forget(self, now_s: float) -> None:
        # Entries older than every window they could count in never matter again; dropping them
        # keeps a long simulation's memory flat (the controller reuses such slots instead).
        up, down = self.spec.rules()
        keep = max(self.spec.controller.downscale_stabilization_s, *self.spec.windows())
        self.recommendations = [r for r in self.recommendations if r.time_s >= now_s - keep]
        longest = max(p.period_s for p in (up.policies or ()) + (down.policies or ()))
        self.scale_events = [e for e in self.scale_events if e.time_s >= now_s - longest]


# ---- the JSON form of a state (`scalelab plan hpa --state FILE.json`) -------------------------

_NUM = (int, float)
_WANT = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
         "list": "a list", "dict": "an object"}
_T = TypeVar("_T")


def _fields(obj: Any, path: str, allowed: Sequence[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadInputError(f"{path}: expected an object {{...}}, got {type(obj).__name__}")
    extra = [k for k in obj if k not in allowed]
    if extra:
        raise BadInputError(f"{path}.{extra[0]}: unknown field; allowed: {', '.join(allowed)}")
    return obj


def _get(d: Mapping[str, Any], key: str, path: str, kind: type | tuple[type, ...],
         default: Any = ..., nullable: bool = False) -> Any:
    if key not in d:
        if default is ...:
            raise BadInputError(f"{path}.{key}: required field is missing")
        return default
    v = d[key]
    if v is None and nullable:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
        raise BadInputError(f"{path}.{key}: must be {_WANT[kinds[-1].__name__]}"
                            f"{' or null' if nullable else ''}, got {v!r}")
    return v


def _numbers(obj: Any, path: str) -> dict[str, float]:
    d = _fields(obj, path, list(obj) if isinstance(obj, dict) else [])
    return {k: float(_get(d, k, path, _NUM)) for k in d}


def _build(where: str, make: Callable[[], _T]) -> _T:
    """Construct a dataclass, prefixing its validation error with the JSON path."""
    try:
        return make()
    except BadInputError as e:
        raise BadInputError(f"{where}: {e}") from None


def _policy_from_json(p: Any, w: str) -> ScalingPolicy:
    pd = _fields(p, w, ["type", "value", "period_s"])
    return _build(w, lambda: ScalingPolicy(type=_get(pd, "type", w, str),
                                           value=_get(pd, "value", w, int),
                                           period_s=_get(pd, "period_s", w, int)))


def _metric_from_json(m: Any, w: str) -> MetricTarget:
    md = _fields(m, w, ["name", "source", "target_type", "target"])
    return _build(w, lambda: MetricTarget(
        name=_get(md, "name", w, str, "cpu"), source=_get(md, "source", w, str, "Resource"),
        target_type=_get(md, "target_type", w, str, "Utilization"),
        target=_get(md, "target", w, _NUM)))


def _rules_from_json(obj: Any, w: str) -> ScalingRules | None:
    if obj is None:
        return None
    rd = _fields(obj, w, ["stabilization_window_s", "select_policy", "policies", "tolerance"])
    policies: tuple[ScalingPolicy, ...] | None = None
    raw = _get(rd, "policies", w, list, None, nullable=True)
    if raw is not None:
        policies = tuple(_policy_from_json(p, f"{w}.policies[{j}]") for j, p in enumerate(raw))
    return _build(w, lambda: ScalingRules(
        stabilization_window_s=_get(rd, "stabilization_window_s", w, int, None, True),
        select_policy=_get(rd, "select_policy", w, str, "Max"), policies=policies,
        tolerance=_get(rd, "tolerance", w, _NUM, None, True)))


def _pod_from_json(p: Any, w: str, i: int) -> PodSample:
    pd = _fields(p, w, ["name", "phase", "deleted", "ready", "start_s", "ready_changed_s",
                        "usage", "requests", "sampled_s"])
    return _build(w, lambda: PodSample(
        name=_get(pd, "name", w, str, f"pod-{i}"), phase=_get(pd, "phase", w, str, "Running"),
        deleted=_get(pd, "deleted", w, bool, False),
        ready=_get(pd, "ready", w, bool, True, nullable=True),
        start_s=_get(pd, "start_s", w, _NUM, None, True),
        ready_changed_s=_get(pd, "ready_changed_s", w, _NUM, None, True),
        usage=_numbers(_get(pd, "usage", w, dict, {}), f"{w}.usage"),
        requests=_numbers(_get(pd, "requests", w, dict, {}), f"{w}.requests"),
        sampled_s=_get(pd, "sampled_s", w, _NUM, None, True)))


def spec_from_json(doc: Any, path: str = "state") -> HpaSpec:
    """The HpaSpec part of the JSON document (min/max_replicas, metrics, behavior, controller)."""
    top = doc if isinstance(doc, dict) else _fields(doc, path, [])
    metrics = [_metric_from_json(m, f"{path}.metrics[{i}]")
               for i, m in enumerate(_get(top, "metrics", path, list))]
    behavior = None
    b = _get(top, "behavior", path, dict, None, nullable=True)
    if b is not None:
        bd = _fields(b, f"{path}.behavior", ["scale_up", "scale_down"])
        behavior = Behavior(
            scale_up=_rules_from_json(bd.get("scale_up"), f"{path}.behavior.scale_up"),
            scale_down=_rules_from_json(bd.get("scale_down"), f"{path}.behavior.scale_down"))
    cw = f"{path}.controller"
    cd = _fields(_get(top, "controller", path, dict, {}), cw,
                 list(ControllerConfig.__dataclass_fields__))
    controller = _build(cw, lambda: ControllerConfig(
        **{k: float(_get(cd, k, cw, _NUM)) for k in cd}))
    return _build(path, lambda: HpaSpec(
        min_replicas=_get(top, "min_replicas", path, int, 1),
        max_replicas=_get(top, "max_replicas", path, int), metrics=tuple(metrics),
        behavior=behavior, controller=controller))


def state_from_json(doc: Any, path: str = "state") -> tuple[HpaState, float]:
    """(state, now_s) from the JSON document described in docs/plan-ops.md.

    Every error names the field: `state.pods[2].usage.cpu: must be a number, got 'x'`.
    """
    top = _fields(doc, path, ["now_s", "current_replicas", "min_replicas", "max_replicas",
                              "metrics", "behavior", "controller", "pods", "values",
                              "recommendations", "scale_events"])
    spec = spec_from_json(top, path)
    pods = [_pod_from_json(p, f"{path}.pods[{i}]", i)
            for i, p in enumerate(_get(top, "pods", path, list, []))]
    recs = []
    for i, r in enumerate(_get(top, "recommendations", path, list, [])):
        w = f"{path}.recommendations[{i}]"
        rd = _fields(r, w, ["time_s", "replicas"])
        recs.append(Recommendation(time_s=float(_get(rd, "time_s", w, _NUM)),
                                   replicas=_get(rd, "replicas", w, int)))
    events = []
    for i, e in enumerate(_get(top, "scale_events", path, list, [])):
        w = f"{path}.scale_events[{i}]"
        ed = _fields(e, w, ["time_s", "change"])
        events.append(ScaleEvent(time_s=float(_get(ed, "time_s", w, _NUM)),
                                 change=_get(ed, "change", w, int)))
    state = _build(path, lambda: HpaState(
        spec=spec, current_replicas=_get(top, "current_replicas", path, int),
        pods=tuple(pods), values=_numbers(_get(top, "values", path, dict, {}), f"{path}.values"),
        recommendations=tuple(recs), scale_events=tuple(events)))
    now = _get(top, "now_s", path, _NUM, 0.0)
    _check(math.isfinite(now), f"{path}.now_s: must be a finite number")
    return state, float(now)
