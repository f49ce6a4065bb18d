"""A load run's result: the merge of every generator process's measurements, and its validity.

Validity asks one question: did the generator offer the load that was asked for? Latency is
timed from each request's due time, so a late generator never hides anything (its lateness is
charged to the server); what a late generator does is change the load: fewer requests per
second than asked, or arrivals bunched together. `validity` flags a level when
- the achieved send rate fell short of the schedule by more than `RATE_TOLERANCE`;
- lag p99 exceeded one mean inter-arrival gap (never less than `LAG_FLOOR_S`): the 99th
  percentile send went out after the next request was due, so arrivals were bunched; or
- lag p99 exceeded `LAG_OBJECTIVE_SHARE` of the SLO threshold: the generator's own lateness
  is a material part of the latency being judged.
Each reason says what to change, from what was measured: when the generator's own thread
waited for a core for `STARVED_WAIT_SHARE` of the run or more (kernel schedstat), or ran its
core near flat out (`SATURATED_CORE_SHARE`), the generator was CPU-starved and the fix is more
processes, --realtime or a quieter machine, even where requests also queued for a connection
(a starved loop reads its responses late, so its connections look busy); otherwise requests
that queued for a connection ask for --max-connections. A level far below the generator's
capacity passes all three on a busy machine: its gaps are long and its lag is a fraction of a
millisecond.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scalelab.lab.core.records import Cost, Record, make_record
from scalelab.lab.core.signals import LATENCY_HISTOGRAM
from scalelab.lab.load.clock import LagStats, lag_stats
from scalelab.lab.load.histogram import LatencyHistogram, Percentiles
from scalelab.lab.load.http.generator import HttpPart
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
from scalelab.lab.load.slices import merge_slices
from scalelab.lab.load.steady import SteadyTrace, merge_traces

RATE_TOLERANCE = 0.02
"""A level is invalid when it sent more than this share below its schedule's rate."""
LAG_FLOOR_S = 0.002
"""The bunching rule never asks for lag p99 under this (2 ms), however short the gap."""
LAG_OBJECTIVE_SHARE = 0.10
"""A level is invalid when lag p99 is more than this share of the SLO's latency threshold."""
STARVED_WAIT_SHARE = 0.25
"""The generator was CPU-starved when its thread waited for a core this share of the run."""
SATURATED_CORE_SHARE = 0.90
"""... or when each generator process kept this share of a core busy (it ran flat out)."""


@dataclass(frozen=True, kw_only=True)
class GeneratorCpu:
    """What the generator's processes got of the CPU over the run (from `HttpPart`s)."""

    busy_cores: float
    """On-CPU seconds of every process's loop thread over the run's wall span."""
    wait_share: float | None
    """Seconds those threads were ready but waited for a core, over the summed spans."""
    machine_busy_cores: float | None
    """Busy cores of the whole machine over the run (the busiest process's reading)."""
    machine_cores: int | None
    """Cores the machine has (the one the generator ran on)."""

    def starved(self, processes: int) -> bool:
        """The starvation rule (module doc): it waited for cores, or ran its cores flat out."""
        waited = self.wait_share is not None and self.wait_share >= STARVED_WAIT_SHARE
        return waited or self.busy_cores >= SATURATED_CORE_SHARE * max(1, processes)

    def describe(self) -> str:
        parts = [f"its loop ran {self.busy_cores:.2f} busy cores"]
        if self.wait_share is not None:
            parts.append(f"waited for a core {self.wait_share:.0%} of the run")
        if self.machine_busy_cores is not None:
            of = f" of {self.machine_cores}" if self.machine_cores else ""
            parts.append(f"the machine's cores were {self.machine_busy_cores:.2f}{of} busy")
        return ", ".join(parts)


def generator_cpu(parts: Sequence[HttpPart], cores: int | None = None) -> GeneratorCpu | None:
    """Merge the processes' CPU readings; None when none was measured."""
    span = max((p.cpu_span_s for p in parts), default=0.0)
    if span <= 0:
        return None
    waits = [p.cpu_wait_s for p in parts if p.cpu_wait_s is not None]
    spans = sum(p.cpu_span_s for p in parts if p.cpu_wait_s is not None)
    machine = [p.machine_busy_cores for p in parts if p.machine_busy_cores is not None]
    return GeneratorCpu(busy_cores=sum(p.cpu_s for p in parts) / span,
                        wait_share=sum(waits) / spans if waits and spans > 0 else None,
                        machine_busy_cores=max(machine) if machine else None,
                        machine_cores=cores if cores is not None else os.cpu_count())


@dataclass(frozen=True, kw_only=True)
class LoadResult(LevelResult):
    """What one load level measured (only requests after the warm-up count)."""

    latency: Percentiles
    """Latency of successes, from the due time (open) or send time (closed)."""
    goodput_rps: float
    """Successes within the SLO latency per second (= throughput when no SLO was given)."""
    slo_threshold_ms: float | None
    """The latency threshold goodput used."""
    within_slo: int
    """Successes at or under the threshold."""
    lag_count: int
    """Sends dispatched more than 1 ms after their due time."""
    lag_max_ms: float
    """Worst dispatch lateness."""
    lag_p50_ms: float | None
    """Median dispatch lateness (send time - due time) of measured sends."""
    lag_p99_ms: float | None
    """99th percentile dispatch lateness."""
    scheduled_rps: float
    """Open loop: the measured sends' rate by their due times (the rate sent_rps should hold)."""
    pool_waits: int
    """Requests that waited for a free connection (max_connections reached)."""
    cold_start_ms: float | None
    """First request on a fresh connection, before the run (not in the percentiles)."""
    cold_start_error: str | None
    """Why the cold-start probe failed, if it did."""
    generator_cpu: GeneratorCpu | None
    """What the generator got of the CPU (None where it was not measured)."""
    hist_blob: str = field(repr=False)
    """Merged HdrHistogram (base64), so any threshold can be evaluated later."""
    steady: SteadyTrace | None = field(default=None, repr=False)
    """Open loop: the processes' steady-state traces added up (`load.steady`)."""
    slice_blobs: list[str] = field(default_factory=list, repr=False)
    """The latencies in consecutive slices, processes added (`load.slices`)."""


def merge(parts: Sequence[HttpPart], *, mode: Mode, offered_rps: float | None,
          concurrency: int | None, arrival: str | None, window_s: float | None,
          slo_threshold_s: float | None, realtime: bool = False,
          more: str = "--processes") -> LoadResult:
    """Merge per-process results; `window_s` is the planned measured span (open loop);
    `more` is what the fixes ask to add for more generators (--processes, or Dask workers)."""
    tally = Tally.of(parts)
    hist = LatencyHistogram()
    for p in parts:
        hist.add_blob(p.hist_blob)
    sent, failures, start = tally.sent, tally.failures, tally.start
    ok = sum(p.ok for p in parts)
    within = sum(p.within for p in parts)
    stopped = tally.stopped_early
    send_span = tally.send_span
    sched_span = send_span
    if mode == "open" and offered_rps:
        # A full-speed run's last send is one gap before the window's end; a run whose
        # generator fell behind sends its last request later than it was due.
        gap = 1.0 / offered_rps
        last_due = max(p.last_due for p in parts)
        sched_span = max(max(0.0, last_due - start) + gap,
                         window_s if (window_s and not stopped) else 0.0)
        send_span = max(sched_span, send_span + gap)
    elif window_s:
        send_span = max(send_span, window_s)
    wall = tally.wall(send_span)
    served = throughput(parts, ok=ok, wall=wall, window_s=window_s, stopped=stopped)
    lag = sum(p.lag_late for p in parts)
    lag_share = lag / sent if sent else 0.0
    lstats = lag_stats([LatencyHistogram.decode(p.lag_blob) for p in parts if p.lag_blob],
                       late=lag)
    # The worst lateness is exact; the histogram's quantiles are each bucket's top (up to 0.1%
    # above the value), so a p99 in the top bucket could read above the max: cap it there.
    lag_max_ms = max(p.lag_max_s for p in parts) * 1e3
    pool_waits = sum(p.pool_waits for p in parts)
    gcpu = generator_cpu(parts)
    sent_rps = sent / send_span if send_span else 0.0
    scheduled_rps = sent / sched_span if sched_span else 0.0
    reasons = validity(mode=mode, offered_rps=offered_rps, sent_rps=sent_rps,
                       scheduled_rps=scheduled_rps, lag=lstats, pool_waits=pool_waits,
                       slo_threshold_s=slo_threshold_s, processes=len(parts),
                       realtime=realtime, cpu=gcpu, more=more)
    if sent == 0:
        reasons.append(NOTHING_MEASURED)
    cold = next((p for p in parts if p.cold_start_s is not None or p.cold_start_error), None)
    cold_ms = None if cold is None or cold.cold_start_s is None else cold.cold_start_s * 1e3
    return LoadResult(
        mode=mode, offered_rps=offered_rps, concurrency=concurrency, arrival=arrival,
        processes=len(parts), requests=sent, successes=ok, failures=failures,
        failure_rate=tally.failure_rate(ok),
        latency=hist.percentiles(), wall_s=wall, sent_rps=sent_rps, scheduled_rps=scheduled_rps,
        throughput_rps=served, goodput_rps=within / wall,
        slo_threshold_ms=None if slo_threshold_s is None else slo_threshold_s * 1e3,
        within_slo=within, errors_by_status=tally.errors_by_status,
        errors_by_kind=tally.errors_by_kind, lag_count=lag, lag_share=lag_share,
        lag_max_ms=lag_max_ms, lag_p50_ms=_at_most(lstats.p50_ms, lag_max_ms),
        lag_p99_ms=_at_most(lstats.p99_ms, lag_max_ms),
        pool_waits=pool_waits,
        connections=tally.connections, **tally.connection_counts(), valid=not reasons,
        invalid_reasons=reasons,
        cold_start_ms=cold_ms,
        cold_start_error=None if cold is None else cold.cold_start_error,
        warmup_requests=tally.warmup_requests, stopped_early=stopped,
        generator_cpu=gcpu,
        hist_blob=hist.encode(),
        steady=(merge_traces([p.steady for p in parts if p.steady is not None])
                if any(p.steady is not None for p in parts) else None),
        slice_blobs=merge_slices([p.slice_blobs for p in parts]),
        traced_requests=tally.traced_requests, trace_ids=tally.trace_ids,
    )


def throughput(parts: Sequence[HttpPart], *, ok: int, wall: float, window_s: float | None,
               stopped: bool) -> float:
    """Successes per second: inside the measured window where every part counted them there
    (open loop; the warm-up's backlog served in the window counts, so an overloaded level
    reads its server's capacity, not capacity diluted by the backlog's drain), else the
    measured requests' successes over the span they took."""
    counts = [p.served_in_window for p in parts]
    if window_s and not stopped and all(c is not None for c in counts):
        return sum(c or 0 for c in counts) / window_s
    return ok / wall


def validity(*, mode: Mode, offered_rps: float | None, sent_rps: float, scheduled_rps: float,
             lag: LagStats, pool_waits: int, slo_threshold_s: float | None,
             processes: int = 1, realtime: bool = False, more: str = "--processes",
             cpu: GeneratorCpu | None = None) -> list[str]:
    """Why a level did not offer the asked-for load (empty: it did). Pure; see the module doc."""
    if mode != "open" or not offered_rps or lag.count == 0:
        return []
    realtime_hint = "" if realtime else "use --realtime, "
    if cpu is not None and cpu.starved(processes):
        fix = (f"the generator was CPU-starved ({cpu.describe()}): add {more} (now "
               f"{processes}), {realtime_hint}or run the generator on a quieter machine")
    elif pool_waits:
        fix = f"{pool_waits} requests waited for a free connection: raise --max-connections"
    else:
        fix = (f"add {more} (now {processes}), lower --rate, {realtime_hint}"
               "or run the generator on a quieter machine")
    out: list[str] = []
    if scheduled_rps > 0 and sent_rps < scheduled_rps * (1.0 - RATE_TOLERANCE):
        out.append(f"generator fell behind: sent {sent_rps:.1f} req/s of the {scheduled_rps:.1f} "
                   f"scheduled ({1 - sent_rps / scheduled_rps:.1%} short, limit "
                   f"{RATE_TOLERANCE:.0%}); {fix}")
    p99_s = (lag.p99_ms or 0.0) / 1e3
    gap_limit = max(LAG_FLOOR_S, 1.0 / offered_rps)
    if p99_s > gap_limit:
        out.append(f"generator lag p99 {p99_s * 1e3:.2f} ms is more than the "
                   f"{gap_limit * 1e3:.2f} ms limit (one inter-arrival gap, at least "
                   f"{LAG_FLOOR_S * 1e3:.0f} ms): arrivals went out bunched; {fix}")
    if slo_threshold_s is not None and p99_s > LAG_OBJECTIVE_SHARE * slo_threshold_s:
        out.append(f"generator lag p99 {p99_s * 1e3:.2f} ms is more than "
                   f"{LAG_OBJECTIVE_SHARE:.0%} of the {slo_threshold_s * 1e3:g} ms objective, so "
                   f"the generator's lateness is part of what is judged; {fix}")
    return out


def to_record(r: LoadResult, *, experiment: str, url: str, repeat: int = 0,
              budget: list[Any] | None = None, slo: str | None = None,
              extra: dict[str, Any] | None = None) -> Record:
    """One foundation record for this level (stage "load", variable rate or concurrency)."""
    variable, level = r.level()
    extras: dict[str, Any] = {
        "url": url, "mode": r.mode, "arrival": r.arrival, "processes": r.processes,
        "offered_rps": r.offered_rps, "sent_rps": r.sent_rps, "goodput_rps": r.goodput_rps,
        "slo": slo, "slo_threshold_ms": r.slo_threshold_ms, "within_slo": r.within_slo,
        "successes": r.successes, "mean_ms": r.latency.mean_ms,
        "samples": r.successes + r.failures,  # core.sheet.SAMPLES_KEY: the verdict's n
        "errors_by_kind": r.errors_by_kind, "errors_by_status": r.errors_by_status,
        "lag": {"count": r.lag_count, "share": r.lag_share, "max_ms": r.lag_max_ms,
                "p50_ms": r.lag_p50_ms, "p99_ms": r.lag_p99_ms},
        "scheduled_rps": r.scheduled_rps,
        "pool_waits": r.pool_waits, "connections": r.connections, **r.connection_fields(),
        "cold_start_ms": r.cold_start_ms, "warmup_requests": r.warmup_requests,
        "invalid_reasons": r.invalid_reasons,
        "generator_cpu": None if r.generator_cpu is None else asdict(r.generator_cpu),
        "cluster": None if r.cluster is None else asdict(r.cluster),
    }
    if budget is not None:
        extras["budget"] = [asdict(b) for b in budget]
    extras.update(extra or {})
    return make_record(
        experiment=experiment, stage="load", variable=variable, level=level, repeat=repeat,
        input_volume=float(r.requests), input_unit="requests", rate=r.throughput_rps,
        rate_unit="requests/s", wall_s=r.wall_s, latency=r.latency.latency(),
        failures=r.failures, failure_rate=r.failure_rate, recovery="replica",
        ok=r.valid, error="; ".join(r.invalid_reasons) or None,
        extras=finite(extras), histograms={LATENCY_HISTOGRAM: r.hist_blob},
        slices={LATENCY_HISTOGRAM: r.slice_blobs} if r.slice_blobs else {},
    )


def _at_most(x: float | None, cap: float) -> float | None:
    return None if x is None else min(x, cap)


CHUNK_SUMMED = ("samples", "successes", "within_slo", "warmup_requests", "server_cpu_s",
                "server_responses", "connections", "pool_waits")
"""Record extras that are counts over the window: a merged level's is their sum."""


def merge_records(chunks: list[Record]) -> Record:
    """One record for a level out of its chunks' (`load run` records of the same level): the
    histograms added (every quantile read from the sum), counts summed, rates over the summed
    measured time. A chunk without its histogram cannot be merged exactly: ValueError."""
    if not chunks:
        raise ValueError("merge_records needs at least one chunk")
    if len(chunks) == 1:
        return chunks[0]
    hist = LatencyHistogram()
    for c in chunks:
        blob = c.histograms.get(LATENCY_HISTOGRAM)
        if blob is None:
            raise ValueError(f"a chunk of {c.stage} at {c.level:g} has no latency histogram "
                             "to merge")
        hist.add_blob(blob)
    last = chunks[-1]
    merged, wall = merged_extras(chunks, counts=CHUNK_SUMMED,
                                 kinds=("errors_by_kind", "errors_by_status"),
                                 rates=("sent_rps", "goodput_rps", "scheduled_rps"))
    extras: dict[str, Any] = {**last.extras, "mean_ms": hist.mean_ms(), **merged}
    successes = extras.get("successes")
    update: dict[str, Any] = {
        **common_update(chunks, extras),
        "extras": extras,
        "latency": hist.percentiles().latency(),
        "histograms": {LATENCY_HISTOGRAM: hist.encode()},
        "rate": successes / wall if isinstance(successes, int) and wall > 0 else last.rate,
    }
    usd = chunks_usd(chunks)
    if usd is not None:
        served = num(extras.get("server_responses"))
        per = usd / served * 1000.0 if served else None
        update["cost"] = Cost(usd=usd, per_unit_usd=per,
                              unit=last.cost.unit if last.cost else None)
    update["energy"] = merged_energy(chunks, update.get("cost"))
    return last.model_copy(update=update)
