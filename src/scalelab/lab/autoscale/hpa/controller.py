"""One sync of the controller (`decide`) and its memory across syncs (`HpaController`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from scalelab.lab.autoscale.hpa.calculator import _object_metric, _pod_metric
from scalelab.lab.autoscale.hpa.decision import MetricResult, SyncDecision
from scalelab.lab.autoscale.hpa.normalization import _normalize_behavior, _normalize_plain
from scalelab.lab.autoscale.hpa.spec import HpaSpec
from scalelab.lab.autoscale.hpa.state import HpaState, PodSample, Recommendation, ScaleEvent
from scalelab.lab.core.errors import BadInputError


def decide(state: HpaState, now_s: float) -> SyncDecision:
    """One reconcile of the HPA at time `now_s` (same clock as the state's timestamps)."""
    spec, cur = state.spec, state.current_replicas
    tol = spec.tolerances()
    d = SyncDecision(now_s=now_s, current_replicas=cur, desired_replicas=cur, rescale=False,
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
        self.last: SyncDecision | None = None

    def due(self, now_s: float) -> bool:
        """Whether a sync is due: the first call, then every sync_period_s."""
        return (self.last_sync_s is None
                or now_s >= self.last_sync_s + self.spec.controller.sync_period_s)

    def step(self, now_s: float, current_replicas: int, pods: Sequence[PodSample] = (),
             values: Mapping[str, float] | None = None) -> SyncDecision | None:
        """Sync if one is due at `now_s`, else None. Pods and values as in `HpaState`."""
        if not self.due(now_s):
            return None
        return self.sync(now_s, current_replicas, pods, values)

    def sync(self, now_s: float, current_replicas: int, pods: Sequence[PodSample] = (),
             values: Mapping[str, float] | None = None) -> SyncDecision:
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
