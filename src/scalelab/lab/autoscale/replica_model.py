"""One replica as measured: the latency-vs-throughput curve the autoscaling simulator serves with.

`ReplicaModel.from_records` reads load records (a `scalelab load` sweep or capacity search, or
`scalelab load llm` records, against ONE replica): per level the served rate, the latency
percentiles and, for streams, e2e, output tokens and the engine's KV usage. Between levels it
interpolates; its saturation rate is the most any record served. `simulator.py` replays a
traffic curve against replicas of this model under the HPA.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.records import Record
from scalelab.lab.load.slo import LatencyObjective

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
class LevelPoint:
    """One measured level of one replica, as the model reads it."""

    rate: float
    """Served requests/s."""
    offered_rps: float | None
    """Offered requests/s (open loop); None for a closed loop, whose levels are all steady."""
    quantiles_ms: tuple[float, float, float, float, float]
    """p50, p90, p95, p99, p99.9 latency (TTFT for generation)."""
    mean_ms: float
    """Mean latency (the median where no mean was recorded)."""
    llm: bool = False
    """A generation level: the three fields below may be set."""
    e2e_mean_ms: float | None = None
    tokens_per_request: float | None = None
    kv_usage: float | None = None
    """Mean KV-cache usage (0..1) from the engine's /metrics."""

    @classmethod
    def of_record(cls, r: Record) -> LevelPoint | None:
        """A load or load llm record's level; None when it lacks a rate or the quantiles."""
        is_llm = r.stage.startswith("llm")
        rate = _num(r.extras.get("throughput_rps")) if is_llm else r.rate
        if not (r.stage.startswith("load") or is_llm) or rate is None or r.latency is None:
            return None
        lat = r.latency
        p50, p90, p95, p99, p999 = lat.p50_ms, lat.p90_ms, lat.p95_ms, lat.p99_ms, lat.p999_ms
        if p50 is None or p90 is None or p95 is None or p99 is None or p999 is None or rate <= 0:
            return None
        q = (p50, p90, p95, p99, p999)
        offered = _num(r.extras.get("offered_rps"))
        mean = _num(r.extras.get("ttft_mean_ms" if is_llm else "mean_ms"))
        e2e = r.extras.get("e2e")
        tps = _num(r.extras.get("output_tps"))
        return cls(rate=rate, offered_rps=offered if offered and offered > 0 else None,
                   quantiles_ms=q, mean_ms=mean if mean is not None else q[0],
                   llm=is_llm,
                   e2e_mean_ms=_num(e2e.get("mean_ms")) if isinstance(e2e, dict) else None,
                   tokens_per_request=tps / rate if tps is not None else None,
                   kv_usage=_num(r.extras.get("engine_kv_usage_mean")))


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
        pts = [p for p in (LevelPoint.of_record(r) for r in records) if p is not None]
        if not pts:
            raise BadInputError("the capacity records have no stage 'load' record with a rate "
                                "and latency percentiles; run `scalelab load URL --rates ...` or "
                                "`scalelab load capacity URL` with --records first")
        return cls.from_points(pts)

    @classmethod
    def from_points(cls, points: Sequence[LevelPoint]) -> ReplicaModel:
        """The model from measured levels of one replica: overloaded ones (served under 95% of
        offered) only tell the saturation rate."""
        sat = max((p.rate for p in points), default=0.0)
        steady = sorted((p for p in points
                         if p.offered_rps is None or p.rate >= _OVERLOAD * p.offered_rps),
                        key=lambda p: p.rate)
        if not steady:
            raise BadInputError("every measured level was overloaded (served under "
                                f"{_OVERLOAD:.0%} of offered): no point of the latency curve")
        # Percentiles must not fall as load rises; noise in the records can make them.
        lat_ms = np.maximum.accumulate(np.array([p.quantiles_ms for p in steady]), axis=0)
        mean = np.maximum.accumulate(np.array([p.mean_ms for p in steady]))
        e2e = kv = None
        tpr = None
        if all(p.llm for p in steady):
            e2es = [p.e2e_mean_ms for p in steady]
            if all(x is not None for x in e2es):
                e2e = tuple(np.maximum.accumulate(np.array(e2es, dtype=float)).tolist())
            tprs = [p.tokens_per_request for p in steady]
            if all(x is not None for x in tprs):
                tpr = float(np.median(np.array(tprs, dtype=float)))
            kvs = [p.kv_usage for p in steady]
            if all(x is not None for x in kvs):
                kv = tuple(np.maximum.accumulate(np.array(kvs, dtype=float)).tolist())
        return cls(rates=tuple(p.rate for p in steady),
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



def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


