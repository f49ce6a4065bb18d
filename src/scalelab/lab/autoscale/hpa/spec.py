"""The HorizontalPodAutoscaler object: metric targets, behavior rules, the controller's flags.

Also the validation helpers and the milli-value conversion the rest of the package shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from scalelab.lab.core.errors import BadInputError

SOURCES = ("Resource", "Pods", "Object", "External")
TARGET_TYPES = {
    "Resource": ("Utilization", "AverageValue"),
    "Pods": ("AverageValue",),
    "Object": ("Value", "AverageValue"),
    "External": ("Value", "AverageValue"),
}
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
