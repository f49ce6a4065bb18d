"""A streaming load level's result: every generator process's measurements merged.

Percentiles of TTFT, ITL, TPOT and e2e come from HdrHistograms (µs, 3 significant digits)
merged across processes; the per-request values are kept too, so goodput under any SLO is
computed exactly afterwards. The record's `latency` is TTFT (what a user waits for before
anything shows); e2e, ITL and TPOT percentiles are in extras. Its rate is output tokens/s.

`merge_records` merges a level's chunks (records of `load llm run` at one concurrency, as
diagnose's sizing runs them) exactly: each of the four HdrHistograms (`Record.histograms`)
is added across chunks and every quantile read from the sum, so a merged TTFT p95 is the p95 of
all the level's requests, not an average of p95s. Counts (requests, tokens, failures, server
CPU seconds, engine scrapes and counters) are summed, rates are over the summed measured time,
the engine's gauges keep their peak (and their mean weighted by scrapes), and the engine's limit
is read again from the merged signals. The quality probe is sent in the first chunk only, so
its agreement is the first chunk's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from scalelab.lab.core.records import Cost, Record, make_record
from scalelab.lab.load.clock import LagStats, lag_stats
from scalelab.lab.load.histogram import LatencyHistogram, Percentiles
from scalelab.lab.load.llm.stream import ProbeAnswer, StreamPart
from scalelab.lab.load.llm.token_slo import (
    Goodput,
    ObjectiveLine,
    Samples,
    TokenSlo,
    cost_per_1k,
    evaluate,
    goodput,
)
from scalelab.lab.load.result import (
    NOTHING_MEASURED,
    LevelResult,
    Tally,
    chunks_usd,
    common_update,
    finite,
    merged_energy,
    merged_extras,
    num,
)
from scalelab.lab.load.schedule import Mode
from scalelab.lab.load.scrape import note_limits
from scalelab.lab.load.slices import merge_slices, slice_blobs

LAG_INVALID_SHARE = 0.05
"""A streaming level is invalid when more than this share of its sends were `LLM_LATE_S` late
(plain HTTP levels are judged by `http.result.validity` instead)."""
LLM_LATE_S = 0.010
"""A streaming run is invalid when more than LAG_INVALID_SHARE of its sends were this late.
Every send's lateness is inside its TTFT anyway (timed from the due time); the question is
only whether the offered rate held, and against TTFTs of tens to hundreds of milliseconds a
few milliseconds of scheduler wake-up on a shared machine does not change the load offered
(the 1 ms `clock.LATE_S` count is still reported, as `lag.late`)."""


@dataclass(frozen=True, kw_only=True)
class LlmResult(LevelResult):
    """What one streaming load level measured (requests after the warm-up only)."""

    ttft: Percentiles
    """Time to first token, from the due time (open) or the send (closed)."""
    itl: Percentiles
    """Every inter-token gap (a chunk of k tokens after g counts k gaps of g/k)."""
    tpot: Percentiles
    """Per request (e2e - TTFT) / (output tokens - 1)."""
    e2e: Percentiles
    """Whole request, from the due time (open) or the send (closed)."""
    output_tokens: int
    """Output tokens of successful requests."""
    prompt_tokens: int | None
    """Prompt tokens of successful requests, as the server reported (None: not reported)."""
    failed_output_tokens: int
    """Tokens streamed by requests that then failed (not in the throughput)."""
    output_tps: float
    """Output tokens per second (successful requests)."""
    total_tps: float
    """Prompt + output tokens per second (output only when prompts were not reported)."""
    token_sources: dict[str, int]
    """Requests by how their tokens per chunk were known (usage-continuous, usage-final,
    chunks)."""
    lag: LagStats
    """Open loop: how late the generator sent (p50/p99/max, and sends over 1 ms late)."""
    max_in_flight: int
    """Most streams outstanding at once (summed over processes)."""
    notes: list[str]
    """How far to trust the token counts (see tokens.py)."""
    blobs: dict[str, str] = field(repr=False)
    """Merged HdrHistograms (base64) of ttft, itl, tpot, e2e."""
    samples: Samples = field(repr=False)
    """Per-request values, for goodput under any SLO."""
    probe: list[ProbeAnswer] = field(default_factory=list, repr=False)
    """The greedy-agreement probe's answers at this level (quality.py)."""
    slices: dict[str, list[str]] = field(default_factory=dict, repr=False)
    """Each metric's latencies in consecutive slices, processes added (`load.slices`)."""

    def itl_within(self, thresholds: Sequence[float]) -> dict[float, tuple[int, int]]:
        h = LatencyHistogram.decode(self.blobs["itl"])
        return {t: (h.count_at_or_below(t), h.count) for t in thresholds}

    def judge(self, slo: TokenSlo) -> tuple[list[ObjectiveLine], Goodput]:
        """The level against `slo`: each objective's line, and goodput."""
        s = self.samples_for(slo)
        return evaluate(slo, s), goodput(slo, s, self.wall_s)

    def samples_for(self, slo: TokenSlo) -> Samples:
        thr = [o.threshold_s for o in slo.objectives if o.metric == "itl"]
        s = self.samples
        return Samples(ttft_us=s.ttft_us, tpot_us=s.tpot_us, e2e_us=s.e2e_us,
                       output_tokens=s.output_tokens, requests=s.requests,
                       itl_within=self.itl_within(thr))


def _hist_us(values: np.ndarray) -> LatencyHistogram:
    h = LatencyHistogram()
    h.record_us(values)
    return h


def _cat(parts: Sequence[StreamPart], name: str) -> np.ndarray:
    arrs = [np.frombuffer(getattr(p, name), dtype=np.int64) if len(getattr(p, name)) else
            np.zeros(0, dtype=np.int64) for p in parts]
    return np.concatenate(arrs) if arrs else np.zeros(0, dtype=np.int64)


def _slices(parts: Sequence[StreamPart]) -> dict[str, list[str]]:
    def of(name: str) -> list[str]:
        arrs = [np.frombuffer(getattr(p, name), dtype=np.int64) for p in parts]
        return merge_slices([slice_blobs(a[a >= 0]) for a in arrs])  # tpot -1: one token

    out = {"ttft": of("ttft_us"), "itl": merge_slices([p.itl_slices for p in parts]),
           "tpot": of("tpot_us"), "e2e": of("e2e_us")}
    return {k: v for k, v in out.items() if v}


def merge(parts: Sequence[StreamPart], *, mode: Mode, offered_rps: float | None,
          concurrency: int | None, arrival: str | None, window_s: float | None,
          more: str = "--processes") -> LlmResult:
    """Merge per-process results; `window_s` is the planned measured span; `more` is what the
    fix asks to add for more generators (--processes, or Dask workers)."""
    tally = Tally.of(parts)
    sources: Counter[str] = Counter()
    itl = LatencyHistogram()
    for p in parts:
        sources.update(p.token_sources)
        if p.itl_blob:
            itl.add_blob(p.itl_blob)
    ttft, e2e, tpot = _cat(parts, "ttft_us"), _cat(parts, "e2e_us"), _cat(parts, "tpot_us")
    out_t, prompt_t = _cat(parts, "output_tokens"), _cat(parts, "prompt_tokens")
    sent, failures, stopped = tally.sent, tally.failures, tally.stopped_early
    ok = len(ttft)
    span = tally.send_span
    if mode == "open" and offered_rps:
        planned = window_s if (window_s and not stopped) else span + 1.0 / offered_rps
        span = max(planned, span + 1.0 / offered_rps)
    elif window_s:
        span = max(span, window_s)
    wall = tally.wall(span)
    lag_hists = [LatencyHistogram.decode(p.lag_blob) for p in parts if p.lag_blob]
    lag = lag_stats(lag_hists, late=sum(p.lag_late for p in parts))
    lag_share = lag.late / sent if sent else 0.0
    very_late = sum(h.count - h.count_at_or_below(LLM_LATE_S) for h in lag_hists)
    reasons: list[str] = []
    if mode == "open" and sent and very_late / sent > LAG_INVALID_SHARE:
        reasons.append(
            f"generator lag: {very_late / sent:.1%} of sends were more than "
            f"{LLM_LATE_S * 1e3:.0f} ms late (limit {LAG_INVALID_SHARE:.0%}), so the offered "
            f"rate was not held; add {more}, raise --max-connections, lower --rate, or use "
            "a quieter machine")
    if sent == 0:
        reasons.append(NOTHING_MEASURED)
    notes: list[str] = []
    if sources.get("chunks"):
        notes.append(f"{sources['chunks']} requests had no usage from the server, so their "
                     "token counts are estimated: one per chunk (an undercount when a chunk "
                     "carries several); ask for usage with --usage continuous or final, or "
                     "count with the model's tokenizer (--tokenizer)")
    if sources.get("tokenizer"):
        notes.append(f"{sources['tokenizer']} requests had no usage from the server: their "
                     "tokens were counted with the model's tokenizer (--tokenizer) over the "
                     "streamed text and split over their chunks by characters")
    if sources.get("usage-final"):
        notes.append(f"{sources['usage-final']} requests reported only a final token count: "
                     "it was split over their chunks by characters (exact at one token per "
                     "chunk, an estimate otherwise)")
    n_out = int(out_t.sum())
    served = in_window(parts) if mode == "open" else None
    known = prompt_t >= 0
    n_prompt = int(prompt_t[known].sum()) if ok and bool(known.all()) else None
    blobs = {"ttft": _hist_us(ttft).encode(), "itl": itl.encode(),
             "tpot": _hist_us(tpot[tpot >= 0]).encode(), "e2e": _hist_us(e2e).encode()}
    return LlmResult(
        mode=mode, offered_rps=offered_rps, concurrency=concurrency, arrival=arrival,
        processes=len(parts), requests=sent, successes=ok, failures=failures,
        failure_rate=tally.failure_rate(ok),
        ttft=LatencyHistogram.decode(blobs["ttft"]).percentiles(), itl=itl.percentiles(),
        tpot=LatencyHistogram.decode(blobs["tpot"]).percentiles(),
        e2e=LatencyHistogram.decode(blobs["e2e"]).percentiles(),
        output_tokens=n_out, prompt_tokens=n_prompt,
        failed_output_tokens=sum(p.failed_output_tokens for p in parts),
        wall_s=wall, sent_rps=sent / span if span else 0.0,
        throughput_rps=served[0] if served else ok / wall,
        output_tps=served[1] if served else n_out / wall,
        total_tps=(n_out + (n_prompt or 0)) / wall,
        errors_by_kind=tally.errors_by_kind, errors_by_status=tally.errors_by_status,
        token_sources=dict(sorted(sources.items())), lag=lag, lag_share=lag_share,
        connections=tally.connections, **tally.connection_counts(),
        max_in_flight=sum(p.max_in_flight for p in parts), valid=not reasons,
        invalid_reasons=reasons, notes=notes, warmup_requests=tally.warmup_requests,
        stopped_early=stopped, blobs=blobs, slices=_slices(parts),
        samples=Samples(ttft_us=ttft, tpot_us=tpot, e2e_us=e2e, output_tokens=out_t,
                        requests=ok + failures, itl_within={}),
        traced_requests=tally.traced_requests, trace_ids=tally.trace_ids,
        probe=[a for p in parts for a in p.probe],
    )


def in_window(parts: Sequence[StreamPart]) -> tuple[float, float] | None:
    """(requests/s, output tokens/s) served inside the open loop's measured window, the
    warm-up's backlog included, as `load.result.throughput` counts a plain HTTP level: an
    overloaded level reads the server's capacity, not capacity diluted by the backlog's
    drain after the window. None where a part counted no window."""
    spans = [p.window_span_s for p in parts]
    if not parts or any(s is None for s in spans):
        return None
    span = max(s or 0.0 for s in spans)
    if span <= 0:
        return None
    return (sum(p.served_in_window or 0 for p in parts) / span,
            sum(p.tokens_in_window or 0 for p in parts) / span)


def pct_dict(p: Percentiles) -> dict[str, float | None]:
    return {"p50_ms": p.p50_ms, "p90_ms": p.p90_ms, "p95_ms": p.p95_ms, "p99_ms": p.p99_ms,
            "p999_ms": p.p999_ms, "max_ms": p.max_ms, "mean_ms": p.mean_ms}


def summary(r: LlmResult) -> dict[str, Any]:
    """The level as plain JSON (no histograms or per-request arrays)."""
    d: dict[str, Any] = {k: v for k, v in r.__dict__.items()
                         if k not in ("blobs", "samples", "probe", "slices")}
    for k in ("ttft", "itl", "tpot", "e2e"):
        d[k] = pct_dict(getattr(r, k))
    d["lag"] = asdict(r.lag)
    return d


def to_record(r: LlmResult, *, experiment: str, url: str, workload: str, repeat: int = 0,
              slo: TokenSlo | None = None, price_per_hour_usd: float | None = None,
              extra: dict[str, Any] | None = None, stage: str = "llm",
              limiting_resource: str | None = None,
              peak_memory_bytes: int | None = None,
              quality: dict[str, float] | None = None) -> Record:
    """One record for this level: stage "llm", variable rate or concurrency, rate in output
    tokens/s, latency = TTFT percentiles; ITL/TPOT/e2e percentiles, goodput and cost in extras."""
    variable, level = r.level()
    extras: dict[str, Any] = {
        "url": url, "workload": workload, "latency_is": "ttft", "mode": r.mode,
        "arrival": r.arrival, "processes": r.processes, "offered_rps": r.offered_rps,
        "sent_rps": r.sent_rps, "throughput_rps": r.throughput_rps, "output_tps": r.output_tps,
        "total_tps": r.total_tps, "successes": r.successes, "output_tokens": r.output_tokens,
        "samples": r.successes + r.failures,  # core.sheet.SAMPLES_KEY: the verdict's n
        "prompt_tokens": r.prompt_tokens, "failed_output_tokens": r.failed_output_tokens,
        "itl": pct_dict(r.itl), "tpot": pct_dict(r.tpot), "e2e": pct_dict(r.e2e),
        "ttft_mean_ms": r.ttft.mean_ms, "errors_by_kind": r.errors_by_kind,
        "errors_by_status": r.errors_by_status, "token_sources": r.token_sources,
        "lag": {**asdict(r.lag), "share": r.lag_share},
        "connections": r.connections, "max_in_flight": r.max_in_flight,
        **r.connection_fields(),
        "warmup_requests": r.warmup_requests, "invalid_reasons": r.invalid_reasons,
        "notes": r.notes,
        "cluster": None if r.cluster is None else asdict(r.cluster),
    }
    # Flat numbers too: the sheet keeps numeric extras (medians over repeats) and objectives
    # name them as extras:<key>, e.g. extras:tpot_p95_ms.
    for name in ("itl", "tpot", "e2e"):
        p = getattr(r, name)
        extras[f"{name}_p50_ms"], extras[f"{name}_p95_ms"] = p.p50_ms, p.p95_ms
        extras[f"{name}_p99_ms"] = p.p99_ms
    # A sequence's mean lifetime: what the autoscaling replay's "sequences" signal holds.
    extras["e2e_mean_ms"] = r.e2e.mean_ms
    extras["availability"] = 1.0 - r.failure_rate
    cost = None
    if slo is not None:
        lines, good = r.judge(slo)
        extras["slo"] = slo.label
        extras["objectives"] = [asdict(x) for x in lines]
        extras["slo_met"] = all(x.met for x in lines)
        extras["goodput"] = asdict(good)
        extras["goodput_rps"], extras["goodput_tps"] = good.goodput_rps, good.goodput_tps
    if price_per_hour_usd is not None:
        c_out = cost_of(price_per_hour_usd, r.output_tps)
        c_tot = cost_of(price_per_hour_usd, r.total_tps)
        extras["cost"] = {"price_per_hour_usd": price_per_hour_usd,
                          "per_1k_output_tokens_usd": c_out, "per_1k_total_tokens_usd": c_tot}
        cost = Cost(usd=price_per_hour_usd * r.wall_s / 3600.0, per_unit_usd=c_out,
                    unit="1k output tokens")
    extras.update(extra or {})
    return make_record(
        experiment=experiment, stage=stage, variable=variable, level=level, repeat=repeat,
        input_volume=float(r.prompt_tokens if r.prompt_tokens is not None else r.requests),
        input_unit="prompt tokens" if r.prompt_tokens is not None else "requests",
        rate=r.output_tps, rate_unit="output tokens/s", wall_s=r.wall_s,
        latency=r.ttft.latency(), failures=r.failures, failure_rate=r.failure_rate,
        recovery="replica", ok=r.valid, error="; ".join(r.invalid_reasons) or None,
        cost=cost, limiting_resource=limiting_resource, peak_memory_bytes=peak_memory_bytes,
        quality=quality or {}, extras=finite(extras), histograms=dict(r.blobs),
        slices=dict(r.slices),
    )


def cost_of(price_per_hour_usd: float, tps: float) -> float | None:
    return cost_per_1k(price_per_hour_usd, tps)


HISTOGRAMS = ("ttft", "itl", "tpot", "e2e")
"""The histograms a `load llm run` record carries in `Record.histograms`."""
CHUNK_SUMMED = ("successes", "samples", "output_tokens", "prompt_tokens",
                "failed_output_tokens", "warmup_requests", "connections", "server_cpu_s",
                "engine_scrapes", "engine_preemptions", "engine_generation_tokens")
"""Counts over a chunk's window: the level's is their sum."""
CHUNK_RATES = ("sent_rps", "throughput_rps", "output_tps", "total_tps", "goodput_rps",
               "goodput_tps")
"""Per-second rates over a chunk's window: the level's is their wall-weighted mean."""
_JUDGED = ("objectives", "slo_met", "goodput", "slo")
"""`load llm run --slo`'s per-request judgement: not recomputable from histograms, dropped."""


def _merged_histograms(chunks: list[Record]) -> dict[str, LatencyHistogram]:
    """The chunks' TTFT, ITL, TPOT and e2e histograms, each added exactly."""
    hists = {k: LatencyHistogram() for k in HISTOGRAMS}
    for c in chunks:
        blobs = c.histograms
        if any(k not in blobs for k in HISTOGRAMS):
            raise ValueError(f"a chunk of {c.stage} at {c.level:g} has no histograms "
                             f"({', '.join(HISTOGRAMS)}) to merge")
        for k in HISTOGRAMS:
            hists[k].add_blob(blobs[k])
    return hists


def _merged_gauges(chunks: list[Record], last: Record) -> dict[str, Any]:
    """Peaks at their largest, engine means weighted by their scrapes: what the chunks'
    gauges say of the whole level (the resource signals are merged with the record's
    fields, load.result.merged_resources)."""
    out: dict[str, Any] = {}
    for k in ("max_in_flight",
              *(k for k in last.extras if k.startswith("engine_") and k.endswith("_max"))):
        vals = [num(c.extras.get(k)) for c in chunks]
        if all(v is not None for v in vals):
            out[k] = max(v or 0.0 for v in vals)
    scrapes = [num(c.extras.get("engine_scrapes")) or 0.0 for c in chunks]
    for k in (k for k in last.extras if k.startswith("engine_") and k.endswith("_mean")):
        vals = [num(c.extras.get(k)) for c in chunks]
        if all(v is not None for v in vals) and sum(scrapes) > 0:
            out[k] = sum((v or 0.0) * n for v, n in zip(vals, scrapes, strict=True)) \
                / sum(scrapes)
    return out


def _merged_extras(chunks: list[Record], hists: dict[str, LatencyHistogram]) -> dict[str, Any]:
    first, last = chunks[0], chunks[-1]
    extras: dict[str, Any] = {k: v for k, v in last.extras.items() if k not in _JUDGED}
    for k in ("itl", "tpot", "e2e"):
        p = pct_dict(hists[k].percentiles())
        extras[k] = p
        for q in ("p50_ms", "p95_ms", "p99_ms"):
            extras[f"{k}_{q}"] = p[q]
    extras["ttft_mean_ms"] = hists["ttft"].mean_ms()
    extras["e2e_mean_ms"] = hists["e2e"].mean_ms()
    merged, _ = merged_extras(
        chunks, counts=CHUNK_SUMMED, kinds=("errors_by_kind", "errors_by_status", "token_sources"),
        rates=CHUNK_RATES)
    extras.update(merged)
    extras.update(_merged_gauges(chunks, last))
    extras["invalid_reasons"] = list(dict.fromkeys(
        x for c in chunks for x in c.extras.get("invalid_reasons") or []))
    extras["notes"] = list(dict.fromkeys(x for c in chunks for x in c.extras.get("notes") or []))
    for k in ("quality_probe", "quality_not_measured"):
        extras.pop(k, None)
        if k in first.extras:
            extras[k] = first.extras[k]
    return extras


def merge_records(chunks: list[Record]) -> Record:
    """One record for the level out of its chunks (load llm run records of one concurrency;
    see the module docstring). A chunk without its four histograms cannot be merged exactly:
    ValueError."""
    if not chunks:
        raise ValueError("merge_records needs at least one chunk")
    if len(chunks) == 1:
        return chunks[0]
    hists = _merged_histograms(chunks)
    first, last = chunks[0], chunks[-1]
    extras = _merged_extras(chunks, hists)
    limit = note_limits(extras)
    update: dict[str, Any] = common_update(chunks, extras)
    if update["failure_rate"] is not None:
        extras["availability"] = 1.0 - update["failure_rate"]
    output_tps = num(extras.get("output_tps"))
    update.update({"extras": extras, "latency": hists["ttft"].percentiles().latency(),
                   "histograms": {k: h.encode() for k, h in hists.items()},
                   "rate": output_tps if output_tps is not None else last.rate,
                   "limiting_resource": limit, "quality": first.quality})
    price = num((last.extras.get("cost") or {}).get("price_per_hour_usd"))
    usd = chunks_usd(chunks)
    if usd is not None:
        per = cost_of(price, output_tps) if price is not None and output_tps else None
        update["cost"] = Cost(usd=usd, per_unit_usd=per, unit=last.cost.unit if last.cost
                              else None)
        if price is not None:
            total_tps = num(extras.get("total_tps"))
            extras["cost"] = {"price_per_hour_usd": price, "per_1k_output_tokens_usd": per,
                              "per_1k_total_tokens_usd": cost_of(price, total_tps)
                              if total_tps else None}
    update["energy"] = merged_energy(chunks, update.get("cost"))
    return last.model_copy(update=update)
