"""The llm stage's advice: the engine's limit from its own /metrics, the setting that fits and
the replicas for the target (from the capacity search where one decided)."""

from __future__ import annotations

import math

from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.objectives import metric_value
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import Advice, AdviceInput, best_capacity, num_text
from scalelab.lab.diagnose.scaling_signal import choose_signal
from scalelab.lab.diagnose.stages.endpoint import with_notes
from scalelab.lab.diagnose.stages.serve_curve import CAPACITY, searches
from scalelab.lab.load.scrape import engine_seen, limiting_signal


def limiting(row: SheetRow) -> str | None:
    """The resource a level ran out of, from the engine's own signals (None: no signals)."""
    if not row.extras.get("engine_scrapes"):
        return None
    return limiting_signal(row.extras)


def engine_evidence(rows: list[SheetRow]) -> list[Evidence]:
    """The engine's limit at the highest level whose /metrics were sampled: the KV pool
    (preemptions, or usage at 95%+) or batch slots (requests waited), with the numbers."""
    sampled = [r for r in sorted(rows, key=lambda r: r.level) if r.extras.get("engine_scrapes")]
    if not sampled:
        return []
    r = sampled[-1]
    sig = limiting_signal(r.extras)
    if sig == "compute":
        return []  # the absence of the other signals, not a measurement of compute
    return [Evidence(resource=sig, detail=f"{', '.join(engine_seen(r.extras))} at "
                                          f"{r.variable}={r.level:g} (the engine's /metrics)")]


_FIX = {
    "kv-cache": "give the KV pool more memory (--kv-cache-bytes) or shorten max_model_len: "
                "preemptions recompute whole sequences",
    "batch-slots": "raise --max-num-seqs (more sequences per continuous batch) while the KV "
                   "pool has room; requests were waiting for a slot",
    "compute": "every sequence ran and none waited: the decode step itself is the limit; "
               "speculative decoding or a smaller/quantized model cut it, replicas divide it",
}


def advise(inp: AdviceInput) -> Advice:
    """The engine setting that fits: the best-measured series, the setting the engine's
    signals point at, and replicas for the target concurrency."""
    goal = inp.goal
    target, base_cap, best_s, best_cap = best_capacity(inp, skip_suffix=CAPACITY)
    parts: list[str] = []
    predicted: list[str] = []
    slo = ", ".join(o.label for o in goal.objectives)
    if best_s is not None and best_s != goal.baseline_series and best_cap is not None \
            and (base_cap is None or best_cap > base_cap):
        parts.append(f"use {best_s}")
        predicted.append(f"{best_s} holds {best_cap:g} concurrent streams at {slo} where "
                         f"{goal.baseline_series} holds {num_text(base_cap)} (measured)")
    rows = sorted(inp.base, key=lambda r: r.level)
    miss = next((r for r in rows if any(o.passes(metric_value(r, o.metric, rows)) is False
                                        for o in goal.objectives)), rows[-1] if rows else None)
    why = limiting(miss) if miss is not None else None
    # "compute" is the engine's absence of other signals: it names the decode step only when
    # the measured CPU says so too.
    if why == "compute" and not any(e.resource == "cpu" for e in inp.limits):
        why = None
    if why is not None:
        parts.append(_FIX[why])
    cap = best_cap if best_cap is not None else base_cap
    searched = searched_replicas(inp)
    if searched is not None:
        n, line = searched
        if n > 1:
            parts.append(f"run {n} replica(s)")
        predicted.append(line)
    elif cap and target > cap:
        n = math.ceil(target / cap)
        parts.append(f"run {n} replica(s)")
        predicted.append(f"{n} replica(s) at {cap:g} streams each hold the {goal.target_multiple:g}"
                         f"× target of {target:g} streams (the highest concurrency measured to "
                         "pass, a lower bound; linear in replicas: measure to confirm)")
    if cap:
        rows = inp.by_series.get(best_s or goal.baseline_series) or inp.base
        parts.append(choose_signal(rows, goal.objectives, target_multiple=goal.target_multiple,
                                   candidates=("sequences", "cpu"), llm=True).text)
    elif inp.base:
        parts.append("even the base concurrency misses the objectives: cut per-token compute "
                     "(a smaller or quantized model, speculative decoding) before replicas")
    predicted += [o.text() for o in searches(inp.by_series)]
    return with_notes(Advice(intervention="; ".join(parts), predicted="; ".join(predicted)),
                      [r for rows in inp.by_series.values() for r in rows])


def searched_replicas(inp: AdviceInput) -> tuple[int, str] | None:
    """Replicas from the capacity search's decided rate (not a grid point): the target's
    request rate is the lowest level's served requests/s × the target multiple (its streams
    at the same pace), divided by what one replica held at the objective. None without a
    decided search or a served request rate."""
    goal = inp.goal
    held = next((o for o in searches(inp.by_series)
                 if o.setting == goal.baseline_series and o.capacity_rps), None)
    rows = sorted(inp.base, key=lambda r: r.level)
    rps = rows[0].extras.get("throughput_rps") if rows else None
    if held is None or held.capacity_rps is None or not isinstance(rps, int | float) or rps <= 0:
        return None
    demand = float(rps) * goal.target_multiple
    n = max(1, math.ceil(demand / held.capacity_rps))
    return n, (f"{n} replica(s) hold the {goal.target_multiple:g}× target of {demand:.4g} "
               f"requests/s ({rps:.4g} served at {rows[0].variable}={rows[0].level:g} × "
               f"{goal.target_multiple:g}) at the searched capacity of {held.capacity_rps:.4g} "
               "requests/s each (measured; linear in replicas: measure to confirm)")
