"""Autoscaling simulator: replay a traffic trace against replicas driven by the Kubernetes HPA.

Replicas behave as measured: each serves requests with the latency-vs-throughput curve read from
load records (a `scalelab load` sweep or capacity search against ONE replica) up to its
saturation throughput (the most any record achieved); past it, arrivals queue in a shared backlog
that adds its drain time to every request's latency. New replicas take `startup_s` to become
ready and get traffic only then. Every second the simulator computes each signal per ready pod:

- cpu: utilization % = 100 × served rate / saturation rate (a pod requests one core);
- rps: arrival rate per ready pod (what an ingress or load balancer reports);
- inflight: Little's law, served rate × mean latency, plus the backlog's share;
- queue: waiting requests, served rate × (mean latency - mean latency at zero load), plus the
  backlog's share (Little's law on the waiting time alone).

From `scalelab load llm` records (stage "llm": served requests/s from `throughput_rps`,
latency = TTFT, so `queue` is the requests waiting for their first token) three more, the
signals a generation engine exports:
- sequences: running + waiting sequences, served rate × mean e2e (a stream holds its sequence
  until its last token), plus the backlog's share (vLLM's num_requests_running + _waiting);
- tokens: output tokens/s arriving per ready pod (rate × measured output tokens per request);
- kv: KV-cache usage %, the engine's own measured mean at the served rate (interpolated;
  needs records taken with --metrics-url), 100 while a backlog waits.

Scale to zero (min replicas 0): the HPA scales from zero only on an Object or External metric
(a per-pod metric vanishes with the last pod), so with `external` the signal is one External
value, the total over the ready pods plus what waits while none is (the backlog of a queue in
front of the service, or the arrival rate for rps/tokens), against an AverageValue target per
pod. Requests that arrive while no replica is ready wait for the first one, start-up included
(`autoscale.coldstart`); the result reports them beside the replica-seconds.

The controller is `scalelab.lab.autoscale.hpa.HpaController` unchanged (sync period, tolerance,
stabilisation windows, scale-up limits, behavior, CPU readiness rules); it sees each metric
averaged over the last `metric_window_s` seconds, like metrics-server's window.
Defaults put every signal's target at the same operating point, `design_load` × the SLO capacity
of one replica, so a comparison is of dynamics, not of set points.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.lab.autoscale.coldstart import ColdStart, cold_start
from scalelab.lab.autoscale.hpa import HpaController, HpaSpec, MetricTarget, PodSample
from scalelab.lab.autoscale.replica_model import EXTERNAL_SIGNALS, SIGNALS, ReplicaModel, Signal
from scalelab.lab.autoscale.traffic import TrafficCurve
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.load.slo import LatencyObjective


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """One simulation."""

    signal: Signal
    """The metric the HPA scales on."""
    target: float
    """Its target per pod (cpu, kv: whole percent; rps: req/s; inflight, queue, sequences:
    requests; tokens: output tokens/s)."""
    slo: LatencyObjective
    """The latency objective violations are counted against."""
    min_replicas: int = 1
    """HPA minReplicas."""
    max_replicas: int = 20
    """HPA maxReplicas."""
    startup_s: float = 30.0
    """From creation to ready (receiving traffic)."""
    initial_replicas: int | None = None
    """Replicas at t=0, all ready (default: enough for the first rate at the target)."""
    metric_window_s: float = 15.0
    """The controller sees each metric averaged over this many past seconds (>= 1)."""
    price_per_replica_hour: float = 1.0
    """Cost of one replica for one hour (any currency)."""
    hpa: HpaSpec | None = None
    """A full HPA spec (behavior, controller flags); its metrics are replaced by `signal`."""
    external: bool = False
    """Read the signal as one External metric (total, AverageValue target per pod), which can
    see demand while no pod runs: what min_replicas 0 needs."""

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise BadUsageError(f"--signal must be one of {', '.join(SIGNALS)}")
        if not (self.target > 0 and math.isfinite(self.target)):
            raise BadUsageError(f"--target must be positive, got {self.target}")
        if not (0 <= self.min_replicas <= self.max_replicas and self.max_replicas >= 1):
            raise BadUsageError("need 0 <= --min <= --max and --max >= 1")
        if self.external and self.signal not in EXTERNAL_SIGNALS:
            raise BadUsageError(f"--external takes a signal with a total while no pod runs "
                                f"({', '.join(EXTERNAL_SIGNALS)}), not {self.signal}")
        if self.min_replicas == 0 and not self.external:
            raise BadUsageError(
                "--min 0 (scale to zero) needs --external: the HPA scales from zero only on an "
                "Object or External metric, since a per-pod metric vanishes with the last pod "
                "(e.g. --signal queue --external: the queue in front of the service)")
        if self.startup_s < 0 or self.metric_window_s < 1:
            raise BadUsageError("--startup must be >= 0 and the metric window >= 1 s")

    def spec(self) -> HpaSpec:
        metric = (MetricTarget(name="cpu", target=float(round(self.target)))
                  if self.signal == "cpu" else
                  MetricTarget(name=self.signal,
                               source="External" if self.external else "Pods",
                               target_type="AverageValue", target=self.target))
        if self.hpa is None:
            return HpaSpec(min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                           metrics=(metric,))
        return HpaSpec(min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                       metrics=(metric,), behavior=self.hpa.behavior,
                       controller=self.hpa.controller)


@dataclass(kw_only=True)
class _Pod:
    name: str
    created_s: float | None
    ready_s: float


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A sync that changed the replica count."""

    t_s: float
    current: int
    desired: int
    reason: str
    usage_ratio: float | None


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What one signal did over the trace."""

    signal: Signal
    target: float
    duration_s: float
    total_requests: float
    violating_requests: float
    """Requests slower than the SLO threshold (from the percentile curve and the backlog)."""
    violating_share: float
    violation_minutes: float
    """Minutes in which the objective's quantile was over its threshold."""
    replica_hours: float
    """All replicas, starting ones included, over the trace."""
    cost: float
    oscillations: int
    """Direction changes between successive scale events (up then down, or down then up)."""
    scale_events: int
    max_replicas: int
    mean_replicas: float
    decisions: list[Decision]
    timeline: dict[str, list[float]] = field(repr=False)
    """Every `timeline_step_s`: t_s, rate, replicas, ready, quantile_ms, signal."""
    min_replicas: int = 1
    startup_s: float = 0.0
    cold_start: ColdStart | None = None
    """Requests that met no ready replica and their wait (see `autoscale.coldstart`)."""

    @property
    def replica_seconds(self) -> float:
        return self.replica_hours * 3600.0


def default_target(signal: Signal, model: ReplicaModel, slo: LatencyObjective,
                   design_load: float) -> float:
    """Each signal's value at the design point: design_load × one replica's SLO capacity."""
    lam = design_load * min(model.slo_capacity(slo), model.saturation_rps)
    if lam <= 0:
        raise BadInputError(f"one replica never meets {slo.label} in these records; "
                            "there is no operating point to scale toward")
    if signal == "cpu":
        return float(max(1, round(100 * lam / model.saturation_rps)))
    if signal == "rps":
        return lam
    if signal == "inflight":
        return max(0.01, lam * model.mean_latency_ms(lam) / 1e3)
    _needs(model, signal)
    if signal == "sequences":
        return max(0.01, lam * model.e2e_ms(lam) / 1e3)
    if signal == "tokens":
        assert model.tokens_per_request is not None
        return lam * model.tokens_per_request
    if signal == "kv":
        return float(min(100, max(1, round(100 * model.kv_at(lam)))))
    wait = max(0.0, model.mean_latency_ms(lam) - model.mean_latency_ms(0.0))
    return max(0.1, lam * wait / 1e3)


def _needs(model: ReplicaModel, signal: Signal) -> None:
    if signal not in model.signals():
        raise BadInputError(
            f"--signal {signal} needs records of `scalelab load llm` (stage llm)"
            + (" taken with --metrics-url (the engine's KV usage)" if signal == "kv" else "")
            + f"; these records support {', '.join(model.signals())}")


def simulate(trace: TrafficCurve, model: ReplicaModel, cfg: SimConfig, *,
             timeline_step_s: float = 60.0) -> SimResult:
    """Replay `trace` second by second; the HPA syncs on its own period."""
    _needs(model, cfg.signal)
    spec = cfg.spec()
    hpa = HpaController(spec)
    sat = model.saturation_rps
    thr_ms = cfg.slo.threshold_s * 1e3
    n_steps = math.floor(trace.duration_s) + 1
    rates = trace.rate_at(np.arange(n_steps, dtype=float))
    if cfg.initial_replicas is not None:
        n0 = cfg.initial_replicas
    else:
        per = default_target("rps", model, cfg.slo, 0.7) if cfg.signal != "rps" else cfg.target
        n0 = math.ceil(float(rates[0]) / per) if per > 0 else cfg.min_replicas
    n0 = min(max(n0, cfg.min_replicas), cfg.max_replicas)
    pods = [_Pod(name=f"pod-{i}", created_s=None, ready_s=-math.inf) for i in range(n0)]
    serial = n0
    backlog = 0.0
    window: deque[float] = deque(maxlen=max(1, int(cfg.metric_window_s)))
    base_mean = model.mean_latency_ms(0.0)
    total = bad = 0.0
    viol_s = 0
    pod_seconds = 0.0
    decisions: list[Decision] = []
    tl: dict[str, list[float]] = {k: [] for k in
                                  ("t_s", "rate", "replicas", "ready", "quantile_ms", "signal")}
    next_tl = 0.0
    ready_per_s = np.zeros(n_steps, dtype=int)
    for step in range(n_steps):
        t = float(step)
        rate = float(rates[step])
        ready = [p for p in pods if p.ready_s <= t]
        n = len(ready)
        ready_per_s[step] = n
        cap = n * sat
        incoming = rate + backlog
        served = min(incoming, cap)
        backlog = incoming - served
        lam = served / n if n else 0.0
        wait_ms = (backlog / cap * 1e3) if cap > 0 else (math.inf if backlog > 0 else 0.0)
        q_ms = model.quantile_ms(min(lam, sat), cfg.slo.quantile) + wait_ms
        frac = model.bad_fraction(min(lam, sat), thr_ms - wait_ms) if math.isfinite(wait_ms) \
            else 1.0
        if rate > 0:
            total += rate
            bad += rate * frac
            viol_s += int(q_ms > thr_ms)
        value = _pod_signal(cfg.signal, model, rate=rate, lam=lam, ready=n, backlog=backlog,
                            base_mean_ms=base_mean)
        if cfg.external:
            # One value for the whole service; with no pod ready it is what waits in front
            # (or arrives), which is how an External metric sees demand at zero replicas.
            value = value * n if n else _demand_at_zero(cfg.signal, rate, backlog, model)
        window.append(value)
        if hpa.due(t):
            metric = float(np.mean(window))
            samples = [_sample(p, t, cfg.signal, metric) for p in pods]
            d = hpa.step(t, len(pods), samples,
                         values={cfg.signal: metric} if cfg.external else None)
            if d is not None and d.rescale:
                decisions.append(Decision(t_s=t, current=len(pods), desired=d.desired_replicas,
                                          reason=d.reason, usage_ratio=d.usage_ratio))
                if d.desired_replicas > len(pods):
                    for _ in range(d.desired_replicas - len(pods)):
                        pods.append(_Pod(name=f"pod-{serial}", created_s=t,
                                         ready_s=t + cfg.startup_s))
                        serial += 1
                else:
                    # The ReplicaSet deletes not-ready pods first, then the newest.
                    pods.sort(key=lambda p: (p.ready_s <= t, -(p.created_s or -math.inf)))
                    del pods[: len(pods) - d.desired_replicas]
        pod_seconds += len(pods)
        if t >= next_tl:
            next_tl += timeline_step_s
            for k, v in (("t_s", t), ("rate", rate), ("replicas", len(pods)), ("ready", n),
                         ("quantile_ms", q_ms if math.isfinite(q_ms) else -1.0),
                         ("signal", value)):
                tl[k].append(float(v))
    counts = tl["replicas"]
    return SimResult(
        signal=cfg.signal, target=cfg.target, duration_s=float(n_steps),
        total_requests=total, violating_requests=bad,
        violating_share=bad / total if total else 0.0, violation_minutes=viol_s / 60.0,
        replica_hours=pod_seconds / 3600.0,
        cost=pod_seconds / 3600.0 * cfg.price_per_replica_hour,
        oscillations=_direction_changes(decisions), scale_events=len(decisions),
        max_replicas=int(max([n0, *[d.desired for d in decisions]])),
        mean_replicas=pod_seconds / n_steps, decisions=decisions,
        timeline=tl if counts else {}, min_replicas=cfg.min_replicas, startup_s=cfg.startup_s,
        cold_start=cold_start(rates.tolist(), ready_per_s.tolist()),
    )


def _pod_signal(signal: Signal, model: ReplicaModel, *, rate: float, lam: float, ready: int,
                backlog: float, base_mean_ms: float) -> float:
    """One second's value of the signal per ready pod: `lam` is what each pod serves, and the
    backlog's share waits in front of each."""
    n, sat = ready, model.saturation_rps
    share = backlog / n if n else 0.0
    if signal == "cpu":
        return 100.0 * min(lam / sat, 1.0) if n else 0.0
    if signal == "rps":
        return rate / n if n else 0.0
    if signal == "inflight":
        return lam * model.mean_latency_ms(lam) / 1e3 + share
    if signal == "sequences":
        return lam * model.e2e_ms(min(lam, sat)) / 1e3 + share
    if signal == "tokens":
        return rate / n * (model.tokens_per_request or 0.0) if n else 0.0
    if signal == "kv":
        return 100.0 if backlog > 0 else 100.0 * model.kv_at(min(lam, sat))
    return lam * max(0.0, model.mean_latency_ms(lam) - base_mean_ms) / 1e3 + share


def _demand_at_zero(signal: Signal, rate: float, backlog: float, model: ReplicaModel) -> float:
    if signal == "rps":
        return rate
    if signal == "tokens":
        return rate * (model.tokens_per_request or 0.0)
    return backlog  # queue, inflight, sequences: every waiting request counts


def _sample(p: _Pod, t: float, signal: Signal, metric: float) -> PodSample:
    ready = p.ready_s <= t
    usage: dict[str, float] = {}
    if ready:
        usage = {"cpu": metric / 100.0} if signal == "cpu" else {signal: metric}
    return PodSample(name=p.name, ready=ready, start_s=p.created_s,
                     ready_changed_s=(p.ready_s if ready and p.created_s is not None else None),
                     usage=usage, requests={"cpu": 1.0})


def _direction_changes(decisions: Sequence[Decision]) -> int:
    dirs = [1 if d.desired > d.current else -1 for d in decisions if d.desired != d.current]
    return sum(1 for a, b in itertools.pairwise(dirs) if a != b)


def scale_to_zero(zero: SimResult, one: SimResult, price_per_replica_hour: float
                  ) -> dict[str, Any]:
    """What min 0 buys against min 1 on the same trace and signal: the replica-seconds saved
    (their cost at the price) and what the cold starts cost the requests (pure)."""
    cs = zero.cold_start or cold_start([], [])
    saved = one.replica_seconds - zero.replica_seconds
    return {
        "signal": zero.signal, "startup_s": zero.startup_s, "cold_requests": cs.requests,
        "episodes": cs.episodes, "zero_seconds": cs.zero_seconds,
        "added_p50_ms": cs.added_p50_ms, "added_p99_ms": cs.added_p99_ms,
        "added_max_ms": cs.added_max_ms, "unserved": cs.unserved,
        "replica_seconds_min0": zero.replica_seconds, "replica_seconds_min1": one.replica_seconds,
        "replica_seconds_saved": saved, "cost_min0": zero.cost, "cost_min1": one.cost,
        "cost_saved": saved / 3600.0 * price_per_replica_hour,
        "added_violating_requests": zero.violating_requests - one.violating_requests,
    }


def rank(results: Sequence[SimResult]) -> list[dict[str, Any]]:
    """Best first: fewest SLO-violating requests (to 0.01% of traffic), then lowest cost."""
    order = sorted(results, key=lambda r: (round(r.violating_share, 4), r.cost))
    return [{"rank": i + 1, "signal": r.signal, "target": r.target,
             "violating_share": r.violating_share, "violation_minutes": r.violation_minutes,
             "replica_hours": r.replica_hours, "cost": r.cost, "oscillations": r.oscillations}
            for i, r in enumerate(order)]
