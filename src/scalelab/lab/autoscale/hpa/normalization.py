"""Normalisation of a proposal: stabilisation windows, then the scale-rate limits."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scalelab.lab.autoscale.hpa.spec import ScalingPolicy, ScalingRules
from scalelab.lab.autoscale.hpa.state import HpaState, ScaleEvent

SCALE_UP_LIMIT_FACTOR = 2.0
SCALE_UP_LIMIT_MINIMUM = 4.0


def _changes_in_period(events: Sequence[ScaleEvent], period_s: int, now: float
                       ) -> tuple[int, int]:
    cutoff = now - period_s
    added = sum(e.change for e in events if e.time_s > cutoff and e.change > 0)
    removed = sum(-e.change for e in events if e.time_s > cutoff and e.change < 0)
    return added, removed


def _period_starts(current: int, events: Sequence[ScaleEvent], rules: ScalingRules,
                   now: float) -> list[tuple[ScalingPolicy, int]]:
    """Each policy with the replica count at the start of its period (its changes undone)."""
    starts = []
    for p in rules.policies or ():
        added, removed = _changes_in_period(events, p.period_s, now)
        starts.append((p, current - added + removed))
    return starts


def _scale_up_limit(current: int, events: Sequence[ScaleEvent], rules: ScalingRules,
                    now: float) -> int:
    """calculateScaleUpLimitWithScalingRules()."""
    if rules.select_policy == "Disabled":
        return current
    # selectPolicy Min picks the smallest increase; Max (the default) the largest.
    proposals = [start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100))
                 for p, start in _period_starts(current, events, rules, now)]
    return min(proposals) if rules.select_policy == "Min" else max(proposals)


def _scale_down_limit(current: int, events: Sequence[ScaleEvent], rules: ScalingRules,
                      now: float) -> int:
    """calculateScaleDownLimitWithBehaviors(); Percent truncates (int32 conversion)."""
    if rules.select_policy == "Disabled":
        return current
    # For a scale-down the smallest change (Min) is the highest replica count.
    proposals = [start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100))
                 for p, start in _period_starts(current, events, rules, now)]
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
