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
(`load.coldstart`); the result reports them beside the replica-seconds.

The controller is `scalelab.core.hpa.HpaController` unchanged (sync period, tolerance,
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
from typing import Any, Literal

import numpy as np

from scalelab.core.errors import BadInputError, BadUsageError
from scalelab.core.hpa import HpaController, HpaSpec, MetricTarget, PodSample
from scalelab.core.records import Record
from scalelab.load.coldstart import ColdStart, cold_start
from scalelab.load.slo import LatencyObjective
from scalelab.load.traces import Trace

Signal = Literal["cpu", "queue", "inflight", "rps", "sequences", "tokens", "kv"]
SIGNALS: tuple[Signal, ...] = ("cpu", "queue", "inflight", "rps", "sequences", "tokens", "kv")
LLM_SIGNALS: tuple[Signal, ...] = ("sequences", "tokens", "kv")
"""Signals only streaming-LLM records carry the data for."""
EXTERNAL_SIGNALS: tuple[Signal, ...] = ("queue", "inflight", "rps", "sequences", "tokens")
"""Signals that have a total while no pod runs (cpu and kv are shares of a pod's own)."""
_QS = (0.5, 0.9, 0.95, 0.99, 0.999)
_OVERLOAD = 0.95
"""A record whose throughput is under this share of its offered rate was overloaded: it tells
the saturation rate, but its latency (a growing queue) is not a point of the steady curve."""


@dataclass(frozen=True, kw_only=True)
class ReplicaModel:
    """One replica's latency percentiles vs served rate, and its saturation rate."""

    rates: tuple[float, ...]
    """Served rates of the steady points, ascending."""
    latency_ms: tuple[tuple[float, ...], ...]
    """Per point: p50, p90, p95, p99, p99.9 (ms)."""
    mean_ms: tuple[float, ...]
    """Per point: mean latency (p50 when the record has no mean)."""
    saturation_rps: float
    """The most requests/s any record served."""
    e2e_mean_ms: tuple[float, ...] | None = None
    """LLM records: per point, mean e2e (a sequence's lifetime)."""
    tokens_per_request: float | None = None
    """LLM records: output tokens per request (output tokens/s / requests/s)."""
    kv_usage: tuple[float, ...] | None = None
    """LLM records with engine signals: per point, mean KV-cache usage (0..1)."""

    def signals(self) -> tuple[Signal, ...]:
        """The signals these records can drive."""
        out: list[Signal] = ["cpu", "queue", "inflight", "rps"]
        if self.e2e_mean_ms is not None:
            out.append("sequences")
        if self.tokens_per_request is not None:
            out.append("tokens")
        if self.kv_usage is not None:
            out.append("kv")
        return tuple(out)

    def e2e_ms(self, lam: float) -> float:
        assert self.e2e_mean_ms is not None
        return float(np.interp(lam, self.rates, self.e2e_mean_ms)) * self._stretch(lam)

    def kv_at(self, lam: float) -> float:
        assert self.kv_usage is not None
        return float(np.interp(lam, self.rates, self.kv_usage))

    def __post_init__(self) -> None:
        if not self.rates or self.saturation_rps <= 0:
            raise BadInputError("the capacity records hold no usable load level")

    @classmethod
    def from_records(cls, records: Sequence[Record]) -> ReplicaModel:
        pts: list[tuple[float, tuple[float, ...], float]] = []
        llm: list[tuple[float, float | None, float | None, float | None]] = []
        sat = 0.0
        for r in records:
            is_llm = r.stage.startswith("llm")
            rate = _num(r.extras.get("throughput_rps")) if is_llm else r.rate
            if not (r.stage.startswith("load") or is_llm) or rate is None or r.latency is None:
                continue
            lat = r.latency
            vals = (lat.p50_ms, lat.p90_ms, lat.p95_ms, lat.p99_ms, lat.p999_ms)
            if any(v is None for v in vals) or rate <= 0:
                continue
            sat = max(sat, rate)
            offered = r.extras.get("offered_rps")
            if isinstance(offered, int | float) and offered > 0 and rate < _OVERLOAD * offered:
                continue
            mean = r.extras.get("ttft_mean_ms" if is_llm else "mean_ms")
            ms = tuple(float(v) for v in vals if v is not None)
            pts.append((rate, ms, float(mean) if isinstance(mean, int | float) else ms[0]))
            if is_llm:
                e2e = r.extras.get("e2e")
                tps = _num(r.extras.get("output_tps"))
                llm.append((rate, _num(e2e.get("mean_ms")) if isinstance(e2e, dict) else None,
                            tps / rate if tps is not None else None,
                            _num(r.extras.get("engine_kv_usage_mean"))))
        if not pts:
            raise BadInputError("the capacity records have no stage 'load' record with a rate "
                                "and latency percentiles; run `scalelab load URL --rates ...` or "
                                "`scalelab load capacity URL` with --records first")
        pts.sort(key=lambda p: p[0])
        # Percentiles must not fall as load rises; noise in the records can make them.
        lat_ms = np.maximum.accumulate(np.array([p[1] for p in pts]), axis=0)
        mean = np.maximum.accumulate(np.array([p[2] for p in pts]))
        e2e = kv = None
        tpr = None
        if llm and len(llm) == len(pts):
            llm.sort(key=lambda p: p[0])
            if all(p[1] is not None for p in llm):
                e2e = tuple(np.maximum.accumulate(np.array([p[1] for p in llm])).tolist())
            if all(p[2] is not None for p in llm):
                tpr = float(np.median([p[2] for p in llm]))
            if all(p[3] is not None for p in llm):
                kv = tuple(np.maximum.accumulate(np.array([p[3] for p in llm])).tolist())
        return cls(rates=tuple(p[0] for p in pts),
                   latency_ms=tuple(tuple(row) for row in lat_ms.tolist()),
                   mean_ms=tuple(mean.tolist()), saturation_rps=sat, e2e_mean_ms=e2e,
                   tokens_per_request=tpr, kv_usage=kv)

    def _stretch(self, lam: float) -> float:
        """Beyond the last steady point, grow latency like an M/M/1 queue toward saturation."""
        last = self.rates[-1]
        if lam <= last or self.saturation_rps <= last:
            return 1.0
        rho_last = last / self.saturation_rps
        rho = min(lam / self.saturation_rps, 0.999)
        return (1 - rho_last) / (1 - rho)

    def percentiles_ms(self, lam: float) -> np.ndarray:
        arr = np.array(self.latency_ms)
        out = np.array([np.interp(lam, self.rates, arr[:, j]) for j in range(len(_QS))])
        return out * self._stretch(lam)

    def mean_latency_ms(self, lam: float) -> float:
        return float(np.interp(lam, self.rates, self.mean_ms)) * self._stretch(lam)

    def quantile_ms(self, lam: float, q: float) -> float:
        return float(np.interp(q, _QS, self.percentiles_ms(lam)))

    def bad_fraction(self, lam: float, threshold_ms: float) -> float:
        """Share of requests slower than `threshold_ms` at served rate `lam` (interpolated)."""
        p = self.percentiles_ms(lam)
        if threshold_ms <= 0:
            return 1.0
        if threshold_ms >= p[-1]:
            return 0.0 if threshold_ms > p[-1] * 1.0001 else 1 - _QS[-1]
        if threshold_ms < p[0]:
            return 1.0 - _QS[0] * threshold_ms / p[0]
        return 1.0 - float(np.interp(threshold_ms, p, _QS))

    def slo_capacity(self, obj: LatencyObjective) -> float:
        """Highest served rate whose `obj.quantile` latency is at or under its threshold."""
        thr = obj.threshold_s * 1e3
        grid = np.linspace(0.0, self.saturation_rps * 0.999, 2000)
        ok = [g for g in grid if self.quantile_ms(float(g), obj.quantile) <= thr]
        return float(ok[-1]) if ok else 0.0


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
    """Requests that met no ready replica and their wait (see `load.coldstart`)."""

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


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _initial_replicas(cfg: SimConfig, model: ReplicaModel, rate0: float) -> int:
    """Replicas at t=0: as given, or enough for the first rate at the signal's default
    per-replica target (rps), within the HPA's bounds."""
    if cfg.initial_replicas is not None:
        n0 = cfg.initial_replicas
    else:
        per = default_target("rps", model, cfg.slo, 0.7) if cfg.signal != "rps" else cfg.target
        n0 = math.ceil(rate0 / per) if per > 0 else cfg.min_replicas
    return min(max(n0, cfg.min_replicas), cfg.max_replicas)


def _signal(signal: str, model: ReplicaModel, *, rate: float, lam: float, ready: int,
            backlog: float, base_mean_ms: float) -> float:
    """One pod's value of the HPA's signal this second: `lam` is what each of the `ready`
    pods serves, `backlog` what waits in front of them."""
    sat = model.saturation_rps
    share = backlog / ready if ready else 0.0
    if signal == "cpu":
        return 100.0 * min(lam / sat, 1.0) if ready else 0.0
    if signal == "rps":
        return rate / ready if ready else 0.0
    if signal == "inflight":
        return lam * model.mean_latency_ms(lam) / 1e3 + share
    if signal == "sequences":
        return lam * model.e2e_ms(min(lam, sat)) / 1e3 + share
    if signal == "tokens":
        return rate / ready * (model.tokens_per_request or 0.0) if ready else 0.0
    if signal == "kv":
        return 100.0 if backlog > 0 else 100.0 * model.kv_at(min(lam, sat))
    return lam * max(0.0, model.mean_latency_ms(lam) - base_mean_ms) / 1e3 + share


def simulate(trace: Trace, model: ReplicaModel, cfg: SimConfig, *,
             timeline_step_s: float = 60.0) -> SimResult:
    """Replay `trace` second by second; the HPA syncs on its own period."""
    _needs(model, cfg.signal)
    spec = cfg.spec()
    hpa = HpaController(spec)
    sat = model.saturation_rps
    thr_ms = cfg.slo.threshold_s * 1e3
    n_steps = math.floor(trace.duration_s) + 1
    rates = trace.rate_at(np.arange(n_steps, dtype=float))
    n0 = _initial_replicas(cfg, model, float(rates[0]))
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
        value = _signal(cfg.signal, model, rate=rate, lam=lam, ready=n, backlog=backlog,
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
