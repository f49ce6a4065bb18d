"""What every load level's result holds, whatever the protocol, and how the parts add up.

A generator process counts into a `Part` (plain values: it pickles across processes and
hosts); a level's result is a `LevelResult` the protocol extends (`http/result.py`: latency
and generator validity; `llm/result.py`: token timings). The sums every merge takes, the span
that the rates divide by, and the record's level are this module's, so the two stacks cannot
drift apart on what "requests", "failures" or "the level" mean.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scalelab.lab.core.records import Cost, Record
from scalelab.lab.core.signals import Resources
from scalelab.lab.load.cluster import ClusterLevel
from scalelab.lab.load.schedule import Mode

NOTHING_MEASURED = "no request was measured; lengthen --duration or shorten --warmup"
"""The invalid reason of a level whose warm-up took every request."""


@dataclass(kw_only=True)
class Part:
    """One generator process's counts (the protocol's part adds its timings)."""

    sent: int = 0
    """Measured requests sent."""
    ok: int = 0
    """Measured successes."""
    errors_by_status: dict[str, int] = field(default_factory=dict)
    """Non-2xx answers by HTTP status."""
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    """Failures by kind (status, timeout, refused, reset, ...)."""
    warmup_requests: int = 0
    """Requests sent in the warm-up (not measured)."""
    lag_blob: str = ""
    """HdrHistogram of each measured send's lateness (open loop; clock.LagRecorder)."""
    lag_late: int = 0
    """Measured sends more than `clock.LATE_S` late."""
    served_in_window: int | None = None
    """Open loop with `SendConfig.window_s`: successes completed inside the measured window,
    the warm-up's included; None where no window was set."""
    connections_opened: int = 0
    window_start: float = 0.0
    """When the measured window began (the process's clock)."""
    last_send: float = 0.0
    last_done: float = 0.0
    stopped_early: bool = False
    """A stopping rule ended the run before its schedule did."""
    traced: int = 0
    """Measured requests sent with a sampled traceparent (`--trace-sample`)."""
    trace_ids: list[str] = field(default_factory=list)
    """Their trace ids (the first 1,000)."""


@dataclass(frozen=True, kw_only=True)
class Tally:
    """The parts' counts added up: what every protocol's merge starts from."""

    sent: int
    failures: int
    errors_by_kind: dict[str, int]
    errors_by_status: dict[str, int]
    start: float
    """The earliest process's window start."""
    last_send: float
    last_done: float
    stopped_early: bool
    connections: int
    warmup_requests: int
    traced_requests: int
    trace_ids: list[str]

    @classmethod
    def of(cls, parts: Sequence[Part]) -> Tally:
        assert parts
        kinds: Counter[str] = Counter()
        status: Counter[str] = Counter()
        for p in parts:
            kinds.update(p.errors_by_kind)
            status.update(p.errors_by_status)
        return cls(sent=sum(p.sent for p in parts), failures=sum(kinds.values()),
                   errors_by_kind=dict(sorted(kinds.items())),
                   errors_by_status=dict(sorted(status.items())),
                   start=min(p.window_start for p in parts),
                   last_send=max(p.last_send for p in parts),
                   last_done=max(p.last_done for p in parts),
                   stopped_early=any(p.stopped_early for p in parts),
                   connections=sum(p.connections_opened for p in parts),
                   warmup_requests=sum(p.warmup_requests for p in parts),
                   traced_requests=sum(p.traced for p in parts),
                   trace_ids=[t for p in parts for t in p.trace_ids])

    @property
    def send_span(self) -> float:
        """From the window's start to the last measured send."""
        return max(0.0, self.last_send - self.start)

    def wall(self, span: float) -> float:
        """The measured window: the planned or sending span, or longer when answers came
        later (never zero: rates divide by it)."""
        return max(span, self.last_done - self.start, 1e-9)

    def failure_rate(self, ok: int) -> float:
        """failures / (successes + failures); 0 when nothing was answered."""
        return self.failures / (ok + self.failures) if (ok + self.failures) else 0.0


@dataclass(frozen=True, kw_only=True)
class LevelResult:
    """What one load level measured, whatever the protocol (requests after the warm-up)."""

    mode: Mode
    """"open" (arrival schedule) or "closed" (fixed concurrency)."""
    offered_rps: float | None
    """Open loop: the target arrival rate."""
    concurrency: int | None
    """Closed loop: clients."""
    arrival: str | None
    """Open loop: constant or poisson."""
    processes: int
    """Generator processes."""
    requests: int
    """Measured requests sent."""
    successes: int
    """Successes: a 2xx answer (HTTP); a stream that ended and carried a token (LLM)."""
    failures: int
    """Everything else: non-2xx, timeouts, refused and reset connections (see errors_by_kind)."""
    failure_rate: float
    """failures / (successes + failures) (0 when nothing was answered)."""
    wall_s: float
    """Measured window: from the end of warm-up to the last measured response."""
    sent_rps: float
    """Measured sends per second actually achieved."""
    throughput_rps: float
    """Successes per second over the measured window."""
    errors_by_kind: dict[str, int]
    """Failures by kind: the protocol's `ERROR_KINDS` (status, timeout, refused, reset, ...)."""
    errors_by_status: dict[str, int]
    """Non-2xx answers by HTTP status."""
    lag_share: float
    """Share of the measured sends dispatched more than `clock.LATE_S` after their due time."""
    connections: int
    """Connections opened."""
    valid: bool
    """False when the generator could not offer the asked-for load (see invalid_reasons)."""
    invalid_reasons: list[str]
    """Why the run is invalid."""
    warmup_requests: int
    """Requests sent during warm-up (excluded)."""
    stopped_early: bool
    """A stopping rule ended the run before its schedule did."""
    traced_requests: int = 0
    """Measured requests sent with a sampled traceparent (`--trace-sample`)."""
    trace_ids: list[str] = field(default_factory=list)
    """Their trace ids (the first 1,000 per process): look them up in the server's spans."""
    cluster: ClusterLevel | None = None
    """With --cluster: the scheduler and every worker's share, clock offset and validity."""

    def level(self) -> tuple[str, float]:
        """The record's variable and level: the rate (open loop) or the clients (closed)."""
        if self.mode == "open":
            return "rate", float(self.offered_rps or 0.0)
        return "concurrency", float(self.concurrency or 0)


def finite(x: Any) -> Any:
    """Records are strict JSON: NaN/inf become None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


# -- chunks of one level, merged (each result type's `merge_records` calls these) -----------
def num(v: object) -> float | None:
    """A record extra as a float; None when it is not a number."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def summed(chunks: Sequence[Record], keys: Sequence[str]) -> dict[str, float | int]:
    """Counts over each chunk's window, summed (ints stay ints); a key any chunk lacks is left
    out."""
    out: dict[str, float | int] = {}
    for k in keys:
        vals = [c.extras.get(k) for c in chunks]
        if any(num(v) is None for v in vals):
            continue
        total = sum(num(v) or 0.0 for v in vals)
        out[k] = int(total) if all(isinstance(v, int) for v in vals) else total
    return out


def tallies(chunks: Sequence[Record], keys: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per-kind counts (errors by kind or status, ...), added."""
    out: dict[str, dict[str, int]] = {}
    for k in keys:
        tot: Counter[str] = Counter()
        for c in chunks:
            tot.update(c.extras.get(k) or {})
        out[k] = dict(sorted(tot.items()))
    return out


def wall_weighted(chunks: Sequence[Record], keys: Sequence[str], wall: float) -> dict[str, float]:
    """Per-second rates over each chunk's window: the level's is their wall-weighted mean."""
    out: dict[str, float] = {}
    if wall <= 0:
        return out
    for k in keys:
        rates = [num(c.extras.get(k)) for c in chunks]
        if all(v is not None for v in rates):
            out[k] = sum((v or 0.0) * (c.wall_s or 0.0)
                         for v, c in zip(rates, chunks, strict=True)) / wall
    return out


def merged_resources(chunks: Sequence[Record]) -> Resources:
    """The chunks' resource signals as one level's: busy cores over the CPU-weighted span
    (the server's CPU seconds over the seconds each chunk sampled), the largest server peak."""
    last = chunks[-1].resources
    cpus = [num(c.extras.get("server_cpu_s")) for c in chunks]
    busy = [c.resources.cpu_busy_cores for c in chunks]
    peaks = [c.resources.server_peak_rss_bytes for c in chunks]
    update: dict[str, Any] = {
        "server_peak_rss_bytes": max((p for p in peaks if p is not None), default=None)}
    if all(v is not None for v in cpus) and all(b is not None and b > 0 for b in busy):
        spans = sum((c or 0.0) / (b or 1.0) for c, b in zip(cpus, busy, strict=True))
        update["cpu_busy_cores"] = sum(c or 0.0 for c in cpus) / spans if spans else 0.0
    return last.model_copy(update=update)


def merged_energy(chunks: Sequence[Record], cost: Cost | None) -> dict[str, Any]:
    """The chunks' energy extras (diagnose.energy tags each chunk's step): joules summed, per
    unit over the merged cost's units; {} when a chunk has none."""
    joules = [num(c.extras.get("energy_j")) for c in chunks]
    if any(j is None for j in joules):
        return {}
    total = sum(j or 0.0 for j in joules)
    units = cost.usd / cost.per_unit_usd if cost is not None and cost.per_unit_usd else None
    return {"energy_j": total, "energy_per_unit_j": total / units if units else None,
            "energy_basis": "; ".join(dict.fromkeys(str(c.extras.get("energy_basis"))
                                                    for c in chunks))}


def common_update(chunks: Sequence[Record], failures_of: int | None) -> dict[str, Any]:
    """The record fields every result type merges alike: wall, failures, volume, memory peak,
    ok, errors, the first chunk's timestamp, the resource signals and the last server seen
    (`failures_of`: the merged sample count)."""
    last = chunks[-1]
    failures = sum(c.failures for c in chunks)
    return {
        "wall_s": sum(c.wall_s or 0.0 for c in chunks),
        "failures": failures,
        "failure_rate": failures / failures_of if failures_of else last.failure_rate,
        "input_volume": sum(c.input_volume or 0.0 for c in chunks),
        "peak_memory_bytes": max((c.peak_memory_bytes for c in chunks
                                  if c.peak_memory_bytes is not None), default=None),
        "ok": all(c.ok for c in chunks),
        "error": "; ".join(dict.fromkeys(c.error for c in chunks if c.error)) or None,
        "timestamp": chunks[0].timestamp,
        "resources": merged_resources(chunks),
        "server": next((c.server for c in reversed(chunks) if c.server is not None), None),
    }
