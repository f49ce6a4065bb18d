"""The HPA model against hand-checked controller cases (numbers worked out in the comments)."""

from __future__ import annotations

import pytest

from scalelab.lab.autoscale.hpa import (
    Behavior,
    ControllerConfig,
    HpaController,
    HpaSpec,
    HpaState,
    MetricTarget,
    PodSample,
    Recommendation,
    ScaleEvent,
    ScalingPolicy,
    ScalingRules,
    decide,
    state_from_json,
)
from scalelab.lab.core.errors import BadInputError

CPU60 = MetricTarget(name="cpu", target=60)


def cpu_pods(*utils: float | None) -> tuple[PodSample, ...]:
    """Ready running pods at the given CPU percent of a 1-core request (None: no sample)."""
    return tuple(PodSample(name=f"p{i}", usage={} if u is None else {"cpu": u / 100},
                           requests={"cpu": 1.0})
                 for i, u in enumerate(utils))


def state(pods: tuple[PodSample, ...], *, current: int | None = None, target: float = 60,
          min_r: int = 1, max_r: int = 100, behavior: Behavior | None = None,
          recs: tuple[Recommendation, ...] = (), events: tuple[ScaleEvent, ...] = (),
          metrics: tuple[MetricTarget, ...] | None = None, **kw: object) -> HpaState:
    spec = HpaSpec(min_replicas=min_r, max_replicas=max_r, behavior=behavior,
                   metrics=metrics or (MetricTarget(name="cpu", target=target),),
                   controller=ControllerConfig(**kw))  # type: ignore[arg-type]
    return HpaState(spec=spec, current_replicas=len(pods) if current is None else current,
                    pods=pods, recommendations=recs, scale_events=events)


def test_the_issue_example_4_pods_at_90_percent_of_60_gives_6() -> None:
    d = decide(state(cpu_pods(90, 90, 90, 90)), 0.0)
    # utilization = 3600m*100 // 4000m = 90; ratio 90/60 = 1.5; ceil(1.5 × 4) = 6.
    assert (d.desired_replicas, d.reason, d.usage_ratio, d.proposal) == (
        6, "DesiredWithinRange", 1.5, 6)
    assert d.metrics[0].current == 90.0 and d.rescale


@pytest.mark.parametrize(("util", "want", "reason"), [
    (65, 4, "WithinTolerance"),       # 65/60 = 1.083 <= 1.1
    (66, 4, "WithinTolerance"),       # 66/60 = 1.1 exactly: the band is closed
    (67, 5, "DesiredWithinRange"),    # 1.1167 → ceil(4.467) = 5
    (54, 4, "WithinTolerance"),       # 0.9 exactly
    (53, 4, "DesiredWithinRange"),    # 0.8833 → ceil(3.533) = 4: a proposal equal to current
    (44, 3, "DesiredWithinRange"),    # 0.7333 → ceil(2.933) = 3
])
def test_tolerance_band(util: float, want: int, reason: str) -> None:
    d = decide(state(cpu_pods(util, util, util, util)), 0.0)
    assert (d.desired_replicas, d.reason) == (want, reason)


def test_utilization_percentage_is_truncated_like_the_controller() -> None:
    # 3 pods at 66.9%: 2007m*100 // 3000m = 66 (not 66.9), so 66/60 = 1.1 is within tolerance.
    d = decide(state(cpu_pods(66.9, 66.9, 66.9)), 0.0)
    assert d.metrics[0].current == 66.0 and d.desired_replicas == 3


def test_per_direction_tolerances_from_behavior() -> None:
    b = Behavior(scale_up=ScalingRules(tolerance=0.05), scale_down=ScalingRules(tolerance=0.2))
    up = decide(state(cpu_pods(65, 65, 65, 65), behavior=b), 0.0)
    assert up.tolerances == (0.2, 0.05) and up.desired_replicas == 5  # 1.083 > 1.05
    down = decide(state(cpu_pods(50, 50, 50, 50), behavior=b), 0.0)
    assert (down.desired_replicas, down.reason) == (4, "WithinTolerance")  # 0.833 >= 0.8


def test_default_scale_up_limit_is_max_of_double_and_4() -> None:
    d = decide(state(cpu_pods(600, 600), target=60), 0.0)  # ratio 10 → 20, limit max(4, 4)
    assert (d.proposal, d.desired_replicas, d.reason) == (20, 4, "ScaleUpLimit")
    d = decide(state(cpu_pods(600, 600, 600, 600, 600)), 0.0)  # 50, limit 10
    assert (d.desired_replicas, d.reason, d.scaling_limited) == (10, "ScaleUpLimit",
                                                                "ScaleUpLimit")


def test_max_and_min_clamps() -> None:
    d = decide(state(cpu_pods(90, 90, 90, 90), max_r=5), 0.0)  # 6 > max 5 (< limit 8)
    assert (d.desired_replicas, d.reason) == (5, "TooManyReplicas")
    d = decide(state(cpu_pods(10, 10, 10, 10), min_r=2), 0.0)  # ceil(0.1667 × 4) = 1 < min 2
    assert (d.desired_replicas, d.reason) == (2, "TooFewReplicas")


def test_guards_before_any_metric() -> None:
    assert decide(state(cpu_pods(90), current=0), 0.0).reason == "ScalingDisabled"
    d = decide(state(cpu_pods(90), current=12, max_r=10), 0.0)
    assert (d.desired_replicas, d.reason, d.recommendation) == (10, "AboveMaxReplicas", None)
    d = decide(state(cpu_pods(90), current=1, min_r=2), 0.0)
    assert (d.desired_replicas, d.reason) == (2, "BelowMinReplicas")


def test_scale_down_stabilization_takes_the_highest_recent_recommendation() -> None:
    pods = cpu_pods(*[30] * 10)  # ratio 0.5 → 5
    recs = (Recommendation(time_s=-100, replicas=8), Recommendation(time_s=-200, replicas=9),
            Recommendation(time_s=-400, replicas=10))  # -400 is outside the 300 s window
    d = decide(state(pods, recs=recs), 0.0)
    assert (d.proposal, d.stabilized, d.desired_replicas, d.reason) == (
        5, 9, 9, "ScaleDownStabilized")
    assert d.recommendation == Recommendation(time_s=0.0, replicas=5)
    # Without behavior a sample exactly at the cutoff still counts (it is not Before(cutoff)) ...
    edge = (Recommendation(time_s=-300, replicas=10),)
    assert decide(state(pods, recs=edge), 0.0).desired_replicas == 10
    # ... with behavior it must be After(cutoff), so it does not.
    b = Behavior(scale_down=ScalingRules(stabilization_window_s=300))
    assert decide(state(pods, recs=edge, behavior=b), 0.0).desired_replicas == 5


def test_scale_up_stabilization_window_takes_the_lowest() -> None:
    b = Behavior(scale_up=ScalingRules(stabilization_window_s=60))
    recs = (Recommendation(time_s=-30, replicas=5),)
    d = decide(state(cpu_pods(120, 120, 120, 120), behavior=b, recs=recs), 0.0)  # 8
    assert (d.proposal, d.stabilized, d.reason) == (8, 5, "ScaleUpStabilized")


def test_pods_policy_counts_scale_events_in_its_period() -> None:
    b = Behavior(scale_down=ScalingRules(stabilization_window_s=0, policies=(
        ScalingPolicy(type="Pods", value=2, period_s=60),)))
    pods = cpu_pods(*[30] * 10)  # proposal 5
    d = decide(state(pods, behavior=b), 0.0)
    assert (d.desired_replicas, d.reason) == (8, "ScaleDownLimit")  # 10 - 2
    # 1 pod removed 30 s ago: the period started at 11, so 11 - 2 = 9.
    d = decide(state(pods, behavior=b, events=(ScaleEvent(time_s=-30, change=-1),)), 0.0)
    assert d.desired_replicas == 9
    # An event exactly one period ago has left the period (After(cutoff) is strict).
    d = decide(state(pods, behavior=b, events=(ScaleEvent(time_s=-60, change=-1),)), 0.0)
    assert d.desired_replicas == 8


def test_percent_policy_rounds_up_on_scale_up_and_never_goes_below_current() -> None:
    b = Behavior(scale_up=ScalingRules(policies=(
        ScalingPolicy(type="Percent", value=50, period_s=60),)))
    pods = cpu_pods(180, 180, 180, 180)  # ratio 3 → 12
    d = decide(state(pods, behavior=b), 0.0)
    assert (d.desired_replicas, d.reason) == (6, "ScaleUpLimit")  # ceil(4 × 1.5)
    # +2 added 10 s ago: the period started at 2, ceil(2 × 1.5) = 3 < 4, held at current.
    d = decide(state(pods, behavior=b, events=(ScaleEvent(time_s=-10, change=2),)), 0.0)
    assert (d.desired_replicas, d.rescale, d.reason) == (4, False, "ScaleUpLimit")


@pytest.mark.parametrize(("select", "want"), [("Max", 8), ("Min", 5), ("Disabled", 4)])
def test_select_policy_on_scale_up(select: str, want: int) -> None:
    b = Behavior(scale_up=ScalingRules(select_policy=select, policies=(
        ScalingPolicy(type="Pods", value=1, period_s=60),
        ScalingPolicy(type="Percent", value=100, period_s=60))))
    d = decide(state(cpu_pods(300, 300, 300, 300), behavior=b), 0.0)  # proposal 20
    assert (d.desired_replicas, d.reason) == (want, "ScaleUpLimit")


@pytest.mark.parametrize(("select", "want"), [("Max", 5), ("Min", 9), ("Disabled", 10)])
def test_select_policy_on_scale_down(select: str, want: int) -> None:
    b = Behavior(scale_down=ScalingRules(stabilization_window_s=0, select_policy=select,
                                         policies=(ScalingPolicy(type="Pods", value=1,
                                                                 period_s=60),
                                                   ScalingPolicy(type="Percent", value=50,
                                                                 period_s=60))))
    d = decide(state(cpu_pods(*[12] * 10), behavior=b), 0.0)  # 0.2 → 2; Pods 9, Percent 5
    assert d.desired_replicas == want


def test_default_behavior_policies_allow_4_pods_or_double_per_15s() -> None:
    b = Behavior()  # any behavior replaces the max(2×, 4) rule with the policies
    d = decide(state(cpu_pods(600, 600), behavior=b), 0.0)  # 20; max(2 + 4, 2 × 2) = 6
    assert (d.desired_replicas, d.reason) == (6, "ScaleUpLimit")


def test_missing_pods_count_as_full_request_on_scale_down() -> None:
    # 5 pods at 30% and 1 silent: 0.5 over the five; with the silent one at 100% of request,
    # 2500m*100 // 6000m = 41 → 0.6833 → ceil(4.1) = 5 (the five alone would say 3).
    d = decide(state(cpu_pods(30, 30, 30, 30, 30, None)), 0.0)
    m = d.metrics[0]
    assert (m.usage_ratio, m.missing_pods, d.desired_replicas) == (0.5, ("p5",), 5)
    assert m.recomputed_ratio == pytest.approx(41 / 60)


def test_missing_pods_count_as_zero_on_scale_up() -> None:
    # 3 at 90%: 1.5; the silent pod at 0: 2700*100 // 4000 = 67 → 1.1167 → ceil(4.47) = 5.
    d = decide(state(cpu_pods(90, 90, 90, None)), 0.0)
    assert (d.usage_ratio, d.desired_replicas) == (1.5, 5)
    # 2 at 100% of an 80 target (1.25) and 2 silent: 2000*100 // 4000 = 50 → 0.625, which
    # reverses the direction: keep 4.
    d = decide(state(cpu_pods(100, 100, None, None), target=80), 0.0)
    assert (d.desired_replicas, d.reason) == (4, "DirectionReversed")


def test_unready_pods_count_as_zero_on_scale_up_only() -> None:
    never_ready = PodSample(name="u", ready=False, start_s=-1000, usage={"cpu": 0.9},
                            requests={"cpu": 1.0})
    ready = cpu_pods(100, 100)
    # 2 ready at 100% of 50 (ratio 2.0), 2 never-ready pods counted at 0: 50% → 1.0, within.
    pods = (*ready, never_ready, PodSample(name="v", ready=False, start_s=-1000,
                                           requests={"cpu": 1.0}, usage={"cpu": 0.1}))
    d = decide(state(pods, target=50), 0.0)
    assert (d.usage_ratio, d.desired_replicas, d.reason) == (2.0, 4, "WithinTolerance")
    assert d.metrics[0].unready_pods == ("u", "v")
    # 1 ready at 60% of 50 (1.2 → 2 alone) and 3 unready: 600/4000 = 15% → 0.3, reversed.
    pods = (*cpu_pods(60), *(PodSample(name=f"u{i}", phase="Pending", requests={"cpu": 1.0})
                             for i in range(3)))
    d = decide(state(pods, target=50), 0.0)
    assert (d.desired_replicas, d.reason) == (4, "DirectionReversed")
    # On a scale-down unready pods are just left out: 2 ready at 10% of 50 → ceil(0.2 × 2) = 1.
    d = decide(state((*cpu_pods(10, 10), never_ready), target=50), 0.0)
    assert (d.usage_ratio, d.desired_replicas) == (0.2, 1)


def test_cpu_initialization_period_and_readiness_history() -> None:
    def one(**kw: object) -> tuple[str, ...]:
        x = PodSample(name="x", usage={"cpu": 1.0}, requests={"cpu": 1.0},
                      **kw)  # type: ignore[arg-type]
        return decide(state((*cpu_pods(100, 100), x), target=50), 0.0).metrics[0].unready_pods

    assert one(start_s=-60, ready_changed_s=-50) == ()       # a full window since ready
    assert one(start_s=-60, ready_changed_s=-5) == ("x",)     # sample too soon after ready
    assert one(start_s=-60, ready=False) == ("x",)            # not ready yet
    assert one(start_s=-1000, ready=False, ready_changed_s=-500) == ()   # was ready once
    assert one(start_s=-1000, ready=False, ready_changed_s=-990) == ("x",)  # never ready
    assert one(ready=None) == ("x",)                          # no Ready condition at all


def test_failed_and_deleted_pods_are_ignored_and_memory_skips_readiness() -> None:
    pods = (*cpu_pods(90, 90), PodSample(name="f", phase="Failed", requests={"cpu": 1.0}),
            PodSample(name="d", deleted=True, usage={"cpu": 5.0}, requests={"cpu": 1.0}))
    m = decide(state(pods, current=4), 0.0).metrics[0]
    assert (m.ignored_pods, m.ready_pods, m.proposal) == (("f", "d"), 2, 3)  # ceil(1.5 × 2)
    mem = MetricTarget(name="memory", target=50)
    pods = (PodSample(name="a", ready=False, usage={"memory": 1.0}, requests={"memory": 1.0}),
            PodSample(name="b", usage={"memory": 1.0}, requests={"memory": 1.0}))
    m = decide(state(pods, metrics=(mem,)), 0.0).metrics[0]
    assert (m.unready_pods, m.ready_pods, m.proposal) == ((), 2, 4)


def test_average_value_and_value_targets() -> None:
    rps = MetricTarget(name="rps", source="Pods", target_type="AverageValue", target=100)
    pods = tuple(PodSample(name=f"p{i}", usage={"rps": 150}) for i in range(3))
    d = decide(state(pods, metrics=(rps,)), 0.0)
    assert (d.metrics[0].current, d.usage_ratio, d.desired_replicas) == (150.0, 1.5, 5)
    queue = MetricTarget(name="queue", source="Object", target_type="Value", target=100)
    s = HpaState(spec=HpaSpec(max_replicas=100, metrics=(queue,)), current_replicas=2,
                 pods=cpu_pods(0, 0), values={"queue": 250})
    d = decide(s, 0.0)  # 2.5 × 2 ready = 5, limited to max(4, 4)
    assert (d.proposal, d.desired_replicas, d.reason) == (5, 4, "ScaleUpLimit")
    ext = MetricTarget(name="msgs", source="External", target_type="AverageValue", target=100)
    s = HpaState(spec=HpaSpec(max_replicas=100, metrics=(ext,)), current_replicas=4,
                 pods=cpu_pods(0, 0, 0, 0), values={"msgs": 1000})
    d = decide(s, 0.0)  # 1000 / (100 × 4) = 2.5 → ceil(1000/100) = 10, limit 8
    assert (d.usage_ratio, d.proposal, d.desired_replicas) == (2.5, 10, 8)


def test_several_metrics_take_the_largest_and_refuse_to_shrink_on_a_failure() -> None:
    mem = MetricTarget(name="memory", target=50)
    pods = tuple(PodSample(name=f"p{i}", usage={"cpu": 0.9, "memory": 0.9},
                           requests={"cpu": 1.0, "memory": 1.0}) for i in range(4))
    d = decide(state(pods, metrics=(CPU60, mem)), 0.0)  # cpu 6, memory 1.8 → 8
    assert (d.proposal, d.metric) == (8, mem.label)
    pods = tuple(PodSample(name=f"p{i}", usage={"cpu": 0.1}, requests={"cpu": 1.0,
                                                                     "memory": 1.0})
                 for i in range(4))
    d = decide(state(pods, metrics=(CPU60, mem)), 0.0)  # cpu says 1, memory has no samples
    assert (d.desired_replicas, d.reason) == (4, "FailedGetResourceMetric")


def test_no_samples_at_all_fails_and_holds() -> None:
    d = decide(state(cpu_pods(None, None)), 0.0)
    assert (d.desired_replicas, d.rescale, d.reason) == (2, False, "FailedGetResourceMetric")
    assert "did not receive metrics" in d.message


def test_controller_steps_every_sync_period_and_holds_scale_down_for_300s() -> None:
    hpa = HpaController(HpaSpec(max_replicas=10, metrics=(MetricTarget(target=50),)))
    d = hpa.step(0, 4, cpu_pods(100, 100, 100, 100))
    assert d is not None and d.desired_replicas == 8
    assert hpa.step(5, 8, cpu_pods(*[10] * 8)) is None          # not due until 15 s
    first_down = None
    replicas = 8
    for t in range(15, 400, 15):
        d = hpa.step(t, replicas, cpu_pods(*[10] * replicas))
        assert d is not None
        if d.rescale:
            first_down, replicas = t, d.desired_replicas
            break
    # The recommendation of 8 made at t=0 holds until it leaves the 300 s window.
    assert (first_down, replicas) == (315, 2)


def test_controller_records_events_only_with_behavior_and_paces_the_scale_down() -> None:
    b = Behavior(scale_down=ScalingRules(stabilization_window_s=0, policies=(
        ScalingPolicy(type="Pods", value=1, period_s=60),)))
    hpa = HpaController(HpaSpec(max_replicas=10, metrics=(MetricTarget(target=50),),
                                behavior=b))
    replicas, changes = 5, []
    for t in range(0, 181, 15):
        d = hpa.step(t, replicas, cpu_pods(*[5] * replicas))
        assert d is not None
        if d.rescale:
            changes.append((t, d.desired_replicas))
            replicas = d.desired_replicas
    assert changes == [(0, 4), (60, 3), (120, 2), (180, 1)]
    with pytest.raises(BadInputError, match="backwards"):
        hpa.sync(10, replicas, cpu_pods(*[5] * replicas))


def test_validation_messages() -> None:
    with pytest.raises(BadInputError, match="Utilization target"):
        MetricTarget(target=0)
    with pytest.raises(BadInputError, match="target type"):
        MetricTarget(source="Pods", target_type="Utilization", target=1)
    with pytest.raises(BadInputError, match="min_replicas"):
        HpaSpec(min_replicas=5, max_replicas=2, metrics=(CPU60,))
    with pytest.raises(BadInputError, match="current_replicas"):
        HpaState(spec=HpaSpec(max_replicas=2, metrics=(CPU60,)), current_replicas=-1)
    with pytest.raises(BadInputError, match="periodSeconds"):
        ScalingPolicy(type="Pods", value=1, period_s=0)


def test_state_from_json_round_trip_and_named_errors() -> None:
    doc = {"now_s": 0, "current_replicas": 4, "max_replicas": 10,
           "metrics": [{"name": "cpu", "target": 60}],
           "pods": [{"name": f"p{i}", "usage": {"cpu": 0.9}, "requests": {"cpu": 1}}
                    for i in range(4)],
           "behavior": {"scale_down": {"policies": [{"type": "Pods", "value": 1,
                                                     "period_s": 60}]}},
           "recommendations": [{"time_s": -30, "replicas": 4}],
           "scale_events": [{"time_s": -30, "change": 1}]}
    s, now = state_from_json(doc)
    assert decide(s, now).desired_replicas == 6
    bad = {**doc, "pods": [{"name": "p0", "usage": {"cpu": "x"}}]}
    with pytest.raises(BadInputError, match=r"state\.pods\[0\]\.usage\.cpu: must be a number"):
        state_from_json(bad)
    with pytest.raises(BadInputError, match=r"state\.scale_events\[0\]\.change: must be an int"):
        state_from_json({**doc, "scale_events": [{"time_s": -30, "change": "x"}]})
    with pytest.raises(BadInputError, match=r"state\.recommendations\[0\]\.time_s: must be a "):
        state_from_json({**doc, "recommendations": [{"time_s": "a", "replicas": 1}]})
    with pytest.raises(BadInputError, match=r"state\.max_replicas: required"):
        state_from_json({k: v for k, v in doc.items() if k != "max_replicas"})
    with pytest.raises(BadInputError, match=r"state\.metrics\[0\]: .*Utilization target"):
        state_from_json({**doc, "metrics": [{"target": 0}]})
    with pytest.raises(BadInputError, match=r"state\.behavior\.scale_down\.policies\[0\]\.typ"):
        state_from_json({**doc, "behavior": {"scale_down": {"policies": [{"typ": "Pods"}]}}})
