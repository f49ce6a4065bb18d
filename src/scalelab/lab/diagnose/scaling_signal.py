"""The autoscaling signal a "do" line recommends, decided on this run's own levels.

A stage's measured levels of one replica (served requests/s against latency quantiles) become
the autoscaling simulator's replica model (`autoscale.simulator`, what `scalelab autoscale simulate`
reads), and a spike from the lowest level's served rate to the stage's target multiple is
replayed against the HPA scaling on each candidate signal (queue depth against CPU for serving,
running+waiting sequences against CPU for generation), each at its own value at the same design
point. The line names the signal that let the fewest requests miss the latency objective (then
the one that reacted first) and cites, for each, how long after the spike began it first
scaled up and the share of requests over the objective. Where the levels cannot be replayed
(no latency objective, no p99.9, every level overloaded) the line says the choice is a rule of
thumb, and why it was not measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.lab.autoscale.replica_model import LevelPoint, ReplicaModel, Signal
from scalelab.lab.autoscale.simulator import SimConfig, SimResult, default_target, simulate
from scalelab.lab.autoscale.traffic import TrafficCurve
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.units import format_number, format_percent, sig
from scalelab.lab.load.slo import LatencyObjective

NAMES: dict[str, str] = {"queue": "queue depth", "cpu": "CPU",
                         "sequences": "running+waiting sequences", "inflight": "requests in flight",
                         "rps": "requests/s per replica", "tokens": "tokens/s", "kv": "KV usage"}
DESIGN_LOAD = 0.7
"""Each signal's target: its value at this share of one replica's capacity at the objective
(`scalelab autoscale simulate`'s default), so the comparison is of dynamics, not set points."""
SPIKE_AT_S = 300.0
"""When the replayed trace jumps from base to peak: after five minutes at the base (the
HPA's scale-down window), held for five minutes, then back for five."""
_QS = (0.5, 0.9, 0.95, 0.99, 0.999)


@dataclass(frozen=True, kw_only=True)
class SignalRun:
    """One candidate signal replayed on the spike."""

    signal: str
    reacted_s: float | None
    """Seconds from the spike's start to the first scale-up; None: it never scaled up."""
    violating_share: float
    """Share of the trace's requests over the latency objective."""
    result: SimResult


@dataclass(frozen=True, kw_only=True)
class SignalChoice:
    """The recommended signal and the "do" line's clause citing why (or 'rule of thumb')."""

    signal: str
    text: str
    runs: tuple[SignalRun, ...] = ()
    """The replays it rests on; empty for a rule of thumb."""


def _num(row: SheetRow, key: str) -> float | None:
    v = row.extras.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def level_point(row: SheetRow, *, llm: bool) -> LevelPoint | None:
    """A sheet row of one replica as the simulator's level; None without a served rate or
    the five quantiles."""
    rate = _num(row, "throughput_rps") if llm else row.rate
    q = [row.quantiles_ms.get(x) for x in _QS]
    qs = [v for v in q if v is not None]
    if rate is None or rate <= 0 or len(qs) != len(_QS):
        return None
    offered = row.level if row.variable in ("rate", "arrival_rate") else _num(row, "offered_rps")
    mean = _num(row, "ttft_mean_ms" if llm else "mean_ms")
    tps = _num(row, "output_tps")
    return LevelPoint(rate=rate, offered_rps=offered if offered and offered > 0 else None,
                      quantiles_ms=(qs[0], qs[1], qs[2], qs[3], qs[4]),
                      mean_ms=mean if mean is not None else qs[0], llm=llm,
                      e2e_mean_ms=_num(row, "e2e_mean_ms"),
                      tokens_per_request=tps / rate if tps is not None else None,
                      kv_usage=_num(row, "engine_kv_usage_mean"))


def latency_objective(objectives: list[Objective]) -> LatencyObjective | None:
    """The first latency quantile objective with a maximum, as the simulator's objective."""
    for o in objectives:
        if o.quantile is not None and o.max is not None and o.max > 0:
            return LatencyObjective(quantile=o.quantile, threshold_s=o.max / 1e3)
    return None


def _replay(signal: Signal, model: ReplicaModel, slo: LatencyObjective, *, base: float,
            peak: float) -> SignalRun:
    target = default_target(signal, model, slo, DESIGN_LOAD)
    per = DESIGN_LOAD * min(model.slo_capacity(slo), model.saturation_rps)
    # Room to scale to the peak at the design point and past it: the cap must not decide.
    top = max(20, 2 * math.ceil(peak / per)) if per > 0 else 20
    trace = TrafficCurve("spike", (0.0, SPIKE_AT_S, SPIKE_AT_S + 1, 2 * SPIKE_AT_S,
                                   2 * SPIKE_AT_S + 1, 3 * SPIKE_AT_S),
                         (base, base, peak, peak, base, base))
    res = simulate(trace, model,
                   SimConfig(signal=signal, target=target, slo=slo, max_replicas=top))
    up = next((d.t_s for d in res.decisions if d.t_s >= SPIKE_AT_S and d.desired > d.current),
              None)
    return SignalRun(signal=signal, reacted_s=None if up is None else up - SPIKE_AT_S,
                     violating_share=res.violating_share, result=res)


def _reaction(run: SignalRun) -> str:
    who = NAMES.get(run.signal, run.signal)
    if run.reacted_s is None:
        return f"{who} never scaled up"
    return f"{who} scaled up {sig(run.reacted_s)} s after it began"


def choose_signal(rows: list[SheetRow], objectives: list[Objective], *,
                  target_multiple: float, candidates: tuple[Signal, ...],
                  llm: bool = False) -> SignalChoice:
    """Replay `rows` (one replica's levels) on a spike to `target_multiple` × the lowest
    level's served rate, once per candidate signal; the first candidate is the rule of thumb
    when they cannot be replayed."""
    default = candidates[0]
    rule = f"autoscale on {NAMES.get(default, default)} (rule of thumb, not measured here: "
    slo = latency_objective(objectives)
    if slo is None:
        return SignalChoice(signal=default, text=rule + "no latency objective to replay the "
                                                        "levels against)")
    pts = [p for p in (level_point(r, llm=llm) for r in rows) if p is not None]
    if not pts:
        return SignalChoice(signal=default, text=rule + "no level recorded a served rate with "
                                                        "p50 to p99.9)")
    lowest = min(rows, key=lambda r: r.level)
    low = level_point(lowest, llm=llm)
    base = low.rate if low is not None else min(p.rate for p in pts)
    peak = base * target_multiple
    try:
        model = ReplicaModel.from_points(pts)
        runs = [_replay(s, model, slo, base=base, peak=peak) for s in candidates]
    except BadInputError as e:
        return SignalChoice(signal=default, text=rule + f"{e})")
    best = min(runs, key=lambda r: (round(r.violating_share, 4),
                                    math.inf if r.reacted_s is None else r.reacted_s,
                                    r.result.cost))
    others = [r for r in runs if r is not best]
    shares = " against ".join(format_percent(r.violating_share) for r in [best, *others])
    missed = (f"{slo.label} kept for every request in each replay"
              if all(r.violating_share == 0 for r in runs)
              else f"{slo.label} missed for {shares} of requests")
    text = (f"autoscale on {NAMES.get(best.signal, best.signal)} (this run's levels replayed "
            f"through the HPA simulator, a spike from {format_number(base)} to "
            f"{format_number(peak, 'requests/s')}, "
            f"replicas ready {sig(best.result.startup_s)} s after they start: "
            + ", ".join(_reaction(r) for r in [best, *others])
            + f"; {missed})")
    return SignalChoice(signal=best.signal, text=text, runs=tuple(runs))
