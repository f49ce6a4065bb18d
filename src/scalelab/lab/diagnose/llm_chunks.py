"""An llm level's chunks merged into one record, exactly: what diagnose.sizing merges when the
llm stage sizes a level (chunks of `scalelab load llm run` at one concurrency).

A `load llm run` record carries four HdrHistograms (TTFT, ITL, TPOT, e2e; extras
"hdr_histograms"): each is added across chunks and every quantile is read from the sum, so a
merged TTFT p95 is the p95 of all the level's requests, not an average of p95s. Counts
(requests, tokens, failures, server CPU seconds, engine scrapes and counters) are summed, rates
are over the summed measured time, the engine's gauges keep their peak (and their mean weighted
by scrapes), and the engine's limit is read again from the merged signals. The quality probe is
sent in the first chunk only, so its agreement is the first chunk's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scalelab.lab.core.records import Cost, Record
from scalelab.lab.diagnose.sizing import merged_energy, merged_resources
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.llm.result import cost_of, pct_dict
from scalelab.lab.load.scrape import note_limits

HISTOGRAMS = ("ttft", "itl", "tpot", "e2e")
_SUMMED = ("successes", "samples", "output_tokens", "prompt_tokens", "failed_output_tokens",
           "warmup_requests", "connections", "server_cpu_s", "engine_scrapes",
           "engine_preemptions", "engine_generation_tokens")
"""Counts over a chunk's window: the level's is their sum."""
_RATES = ("sent_rps", "throughput_rps", "output_tps", "total_tps", "goodput_rps", "goodput_tps")
"""Per-second rates over a chunk's window: the level's is their wall-weighted mean."""
_JUDGED = ("objectives", "slo_met", "goodput", "slo")
"""`load llm run --slo`'s per-request judgement: not recomputable from histograms, dropped."""


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _sum(chunks: list[Record], key: str) -> float | int | None:
    vals = [c.extras.get(key) for c in chunks]
    if any(_num(v) is None for v in vals):
        return None
    total = sum(_num(v) or 0.0 for v in vals)
    return int(total) if all(isinstance(v, int) for v in vals) else total


def _merged_histograms(chunks: list[Record]) -> dict[str, LatencyHistogram]:
    """The chunks' TTFT, ITL, TPOT and e2e histograms, each added exactly."""
    hists = {k: LatencyHistogram() for k in HISTOGRAMS}
    for c in chunks:
        blobs = c.extras.get("hdr_histograms")
        if not isinstance(blobs, dict) or any(not isinstance(blobs.get(k), str)
                                              for k in HISTOGRAMS):
            raise ValueError(f"a chunk of {c.stage} at {c.level:g} has no hdr_histograms "
                             f"({', '.join(HISTOGRAMS)}) to merge")
        for k in HISTOGRAMS:
            hists[k].add_blob(blobs[k])
    return hists


def _merged_gauges(chunks: list[Record], last: Record) -> dict[str, Any]:
    """Peaks at their largest, engine means weighted by their scrapes, busy cores over the
    CPU-weighted span: what the chunks' gauges say of the whole level."""
    out: dict[str, Any] = {}
    for k in ("max_in_flight",
              *(k for k in last.extras if k.startswith("engine_") and k.endswith("_max"))):
        vals = [_num(c.extras.get(k)) for c in chunks]
        if all(v is not None for v in vals):
            out[k] = max(v or 0.0 for v in vals)
    scrapes = [_num(c.extras.get("engine_scrapes")) or 0.0 for c in chunks]
    for k in (k for k in last.extras if k.startswith("engine_") and k.endswith("_mean")):
        vals = [_num(c.extras.get(k)) for c in chunks]
        if all(v is not None for v in vals) and sum(scrapes) > 0:
            out[k] = sum((v or 0.0) * n for v, n in zip(vals, scrapes, strict=True)) \
                / sum(scrapes)
    return out


def merge_llm_chunks(chunks: list[Record]) -> Record:
    """One record for the level out of its chunks (load llm run records of one concurrency).
    A chunk without its four histograms cannot be merged exactly: ValueError."""
    if not chunks:
        raise ValueError("merge_llm_chunks needs at least one chunk")
    if len(chunks) == 1:
        return chunks[0]
    hists = _merged_histograms(chunks)
    first, last = chunks[0], chunks[-1]
    wall = sum(c.wall_s or 0.0 for c in chunks)
    extras: dict[str, Any] = {k: v for k, v in last.extras.items() if k not in _JUDGED}
    extras["hdr_histograms"] = {k: h.encode() for k, h in hists.items()}
    for k in ("itl", "tpot", "e2e"):
        p = pct_dict(hists[k].percentiles())
        extras[k] = p
        for q in ("p50_ms", "p95_ms", "p99_ms"):
            extras[f"{k}_{q}"] = p[q]
    extras["ttft_mean_ms"] = hists["ttft"].mean_ms()
    extras["e2e_mean_ms"] = hists["e2e"].mean_ms()
    for k in _SUMMED:
        total = _sum(chunks, k)
        if total is not None:
            extras[k] = total
    for k in ("errors_by_kind", "errors_by_status", "token_sources"):
        tot: Counter[str] = Counter()
        for c in chunks:
            tot.update(c.extras.get(k) or {})
        extras[k] = dict(sorted(tot.items()))
    if wall > 0:
        for k in _RATES:
            rates = [_num(c.extras.get(k)) for c in chunks]
            if all(v is not None for v in rates):
                extras[k] = sum((v or 0.0) * (c.wall_s or 0.0)
                                for v, c in zip(rates, chunks, strict=True)) / wall
    extras.update(_merged_gauges(chunks, last))
    extras["invalid_reasons"] = list(dict.fromkeys(
        x for c in chunks for x in c.extras.get("invalid_reasons") or []))
    extras["notes"] = list(dict.fromkeys(x for c in chunks for x in c.extras.get("notes") or []))
    for k in ("quality_probe", "quality_not_measured"):
        extras.pop(k, None)
        if k in first.extras:
            extras[k] = first.extras[k]
    limit = note_limits(extras)
    samples = extras.get("samples")
    failures = sum(c.failures for c in chunks)
    failure_rate = failures / samples if isinstance(samples, int) and samples else \
        last.failure_rate
    if failure_rate is not None:
        extras["availability"] = 1.0 - failure_rate
    output_tps = _num(extras.get("output_tps"))
    update: dict[str, Any] = {
        "extras": extras,
        "latency": hists["ttft"].percentiles().latency(),
        "wall_s": wall,
        "failures": failures,
        "failure_rate": failure_rate,
        "input_volume": sum(c.input_volume or 0.0 for c in chunks),
        "rate": output_tps if output_tps is not None else last.rate,
        "limiting_resource": limit,
        "peak_memory_bytes": max((c.peak_memory_bytes for c in chunks
                                  if c.peak_memory_bytes is not None), default=None),
        "quality": first.quality,
        "ok": all(c.ok for c in chunks),
        "error": "; ".join(dict.fromkeys(c.error for c in chunks if c.error)) or None,
        "timestamp": first.timestamp,
        "resources": merged_resources(chunks),
        "server": next((c.server for c in reversed(chunks) if c.server is not None), None),
    }
    costs = [c.cost for c in chunks]
    price = _num((last.extras.get("cost") or {}).get("price_per_hour_usd"))
    if all(cost is not None for cost in costs):
        usd = sum(cost.usd for cost in costs if cost is not None)
        per = cost_of(price, output_tps) if price is not None and output_tps else None
        update["cost"] = Cost(usd=usd, per_unit_usd=per, unit=last.cost.unit if last.cost
                              else None)
        if price is not None:
            total_tps = _num(extras.get("total_tps"))
            extras["cost"] = {"price_per_hour_usd": price, "per_1k_output_tokens_usd": per,
                              "per_1k_total_tokens_usd": cost_of(price, total_tps)
                              if total_tps else None}
    extras.update(merged_energy(chunks, update.get("cost")))
    return last.model_copy(update=update)
