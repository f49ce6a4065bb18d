"""What one sync looks at: the pods with their samples, and the controller's memory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scalelab.lab.autoscale.hpa.spec import _INT32_MAX, HpaSpec, _check, _finite, _int_in

PHASES = ("Running", "Pending", "Succeeded", "Failed", "Unknown")


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
