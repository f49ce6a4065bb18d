"""The replica calculator: per metric, the usage ratio and the replicas it asks for."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from scalelab.lab.autoscale.hpa.decision import MetricResult
from scalelab.lab.autoscale.hpa.spec import _INT32_MAX, ControllerConfig, MetricTarget, _milli
from scalelab.lab.autoscale.hpa.state import HpaState, PodSample
from scalelab.lab.core.errors import BadInputError


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
