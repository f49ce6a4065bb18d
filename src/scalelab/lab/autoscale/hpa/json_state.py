"""The JSON form of a state (`scalelab plan hpa --state FILE.json`), read with field paths."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from scalelab.lab.autoscale.hpa.spec import (
    Behavior,
    ControllerConfig,
    HpaSpec,
    MetricTarget,
    ScalingPolicy,
    ScalingRules,
    _check,
)
from scalelab.lab.autoscale.hpa.state import HpaState, PodSample, Recommendation, ScaleEvent
from scalelab.lab.core.errors import BadInputError

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


def _timed_counts(top: Mapping[str, Any], key: str, count: str, path: str
                  ) -> list[tuple[float, int]]:
    """(time_s, `count`) of each entry of the list `key` (entries: {"time_s", `count`})."""
    out = []
    for i, entry in enumerate(_get(top, key, path, list, [])):
        w = f"{path}.{key}[{i}]"
        d = _fields(entry, w, ["time_s", count])
        out.append((float(_get(d, "time_s", w, _NUM)), _get(d, count, w, int)))
    return out


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
    recs = [Recommendation(time_s=t, replicas=n)
            for t, n in _timed_counts(top, "recommendations", "replicas", path)]
    events = [ScaleEvent(time_s=t, change=n)
              for t, n in _timed_counts(top, "scale_events", "change", path)]
    state = _build(path, lambda: HpaState(
        spec=spec, current_replicas=_get(top, "current_replicas", path, int),
        pods=tuple(pods), values=_numbers(_get(top, "values", path, dict, {}), f"{path}.values"),
        recommendations=tuple(recs), scale_events=tuple(events)))
    now = _get(top, "now_s", path, _NUM, 0.0)
    _check(math.isfinite(now), f"{path}.now_s: must be a finite number")
    return state, float(now)
