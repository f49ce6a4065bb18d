"""The serve stage's advice: batching and replicas from what the stage measured (the level
sweep's capacity per batching setting, the capacity searches, the replica sweep's curve), the
signal to scale on, and where the throughput curve bends.
"""

from __future__ import annotations

import math

from scalelab.lab.core.knee import find_knee
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import Advice, AdviceInput, best_capacity, num_text
from scalelab.lab.diagnose.scaling_signal import choose_signal
from scalelab.lab.diagnose.stages.endpoint import with_notes
from scalelab.lab.diagnose.stages.serve_curve import (
    CAPACITY,
    REPLICAS,
    THREADS,
    replica_advice,
    searches,
    sweep_points,
)


def measured_capacity(by_series: dict[str, list[SheetRow]]) -> list[str]:
    """From capacity-search steps (series '<setting> capacity'): the highest rate decided to
    pass, and every undecided step with its requests against the rule's."""
    return [o.text() for o in searches(by_series)]


def advise(inp: AdviceInput) -> Advice:
    """Batching and replicas from the measured capacity of each series at the objectives."""
    goal = inp.goal
    target_level, base_cap, best_s, best_cap = best_capacity(inp, skip_suffix=CAPACITY)
    parts: list[str] = []
    predicted: list[str] = []
    slo = ", ".join(o.label for o in goal.objectives)
    if best_s is not None and best_s != goal.baseline_series and best_cap is not None:
        parts.append(f"use {best_s}")
        predicted.append(
            f"{best_s} raises capacity at {slo} from "
            f"{num_text(base_cap)} to {best_cap:g} requests/s (measured)"
        )
    cap = best_cap if best_cap is not None else base_cap
    # The search's decided capacity, where the series has one, is what a replica holds: the
    # grid's highest passing level is only a lower bound (5 replicas where 3 hold).
    searched = {o.setting: o.capacity_rps for o in searches(inp.by_series)}
    cap_series = best_s or goal.baseline_series
    if searched.get(cap_series):
        cap = searched[cap_series]
    sweep = replica_advice(sweep_points(inp.by_series, REPLICAS),
                           sweep_points(inp.by_series, THREADS), target_level,
                           config=replicated(inp.by_series))
    if sweep is not None and sweep.replicas is not None:
        parts.append(f"run {sweep.replicas} replica(s)"
                     + ("" if sweep.measured else " (read off the replica curve: extrapolated)"))
    elif cap:
        replicas = math.ceil(target_level / cap)
        parts.append(f"run {replicas} replica(s)")
        predicted.append(
            f"{replicas} replica(s) of {best_s or 'this configuration'} hold the "
            f"{goal.target_multiple:g}× peak of {target_level:g} requests/s at "
            f"{cap:.4g} requests/s each ("
            + ("its capacity search's, " if searched.get(cap_series) else
               "the highest level measured to pass, ")
            + "linear in replicas from one replica, not measured"
            + (": stages.serve.replicas measures the curve" if sweep is None else
               ", each on cores of its own: the co-located sweep did not reach the peak") + ")"
        )
    if sweep is not None:
        predicted += sweep.lines
    if cap or (sweep is not None and sweep.replicas is not None):
        # One replica's levels of the configuration advised, replayed: which signal to scale on.
        rows = inp.by_series.get(cap_series) or inp.base
        parts.append(choose_signal(rows, goal.objectives, target_multiple=goal.target_multiple,
                                   candidates=("queue", "cpu")).text)
    elif inp.base:
        parts.append(
            "reduce per-request compute (batching, a smaller model) before adding "
            "replicas: even the lowest measured rate misses the objective"
        )
    knee = throughput_knee(inp.base)
    if knee:
        predicted.append(knee)
    predicted += measured_capacity(inp.by_series)
    return with_notes(Advice(intervention="; ".join(parts), predicted="; ".join(predicted)),
                      [r for rows in inp.by_series.values() for r in rows])


def replicated(by_series: dict[str, list[SheetRow]]) -> str:
    """The configuration the replica sweep replicated (its records say), e.g. 'batching=on'."""
    for name, rows in by_series.items():
        if name.startswith(REPLICAS):
            for r in rows:
                if r.extras.get("replicated"):
                    return str(r.extras["replicated"])
    return "the server"


KEPT_UP = 0.95
"""A level whose served rate is at least this share of its offered rate kept up with it."""


def throughput_knee(rows: list[SheetRow]) -> str:
    """Where the served rate stops following the offered rate (Kneedle on the measured curve;
    on a curve too short for Kneedle's threshold, the last level that kept up before one
    that did not), or that it still follows at the highest level measured."""
    pts = sorted((r.level, r.rate) for r in rows if r.rate is not None)
    if len(pts) < 3:
        return ""
    knee = find_knee([x for x, _ in pts], [y for _, y in pts], curve="concave")
    top_offered, top_served = pts[-1]
    behind = next((i for i, (x, y) in enumerate(pts) if x > 0 and y < KEPT_UP * x), None)
    if knee is None and behind is not None and behind > 0:
        knee = pts[behind - 1][0]
    if knee is None:
        return (
            f"no knee in the throughput curve up to {top_offered:g} requests/s offered "
            f"({top_served:.4g} served): serving still scales there; measure higher rates"
        )
    served = dict(pts)[knee]
    return (
        f"the throughput curve bends at {knee:g} requests/s offered ({served:.4g} served, "
        f"measured): beyond it the served rate stops following the offered rate"
        + (f" ({top_offered:g} offered, {top_served:.4g} served)" if top_offered > knee
           else "")
    )
