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
from scalelab.lab.core.signals import Energy, Resources
from scalelab.lab.load.cluster import ClusterLevel
from scalelab.lab.load.schedule import Mode
from scalelab.lab.load.slices import chained

NOTHING_MEASURED = "no request was measured; lengthen --duration or shorten --warmup"
"""The invalid reason of a level whose warm-up took every request."""
DEFAULT_AVAILABILITY = 0.99
"""The availability objective a level's `healthy` verdict judges where none was given."""


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
    server_closes: int = 0
    """Connections the server closed, or said it would (`Connection: close`, HTTP/1.0)."""
    retries: int = 0
    """Requests sent once more on a fresh connection: the server had closed their kept-alive
    connection before writing any byte of an answer (`HttpConnection.retryable`)."""
    retry_after_count: int = 0
    """Measured refusals (non-2xx) that carried Retry-After."""
    retry_after_max_s: float | None = None
    """The longest Retry-After they asked for (seconds)."""
    error_examples: dict[str, str] = field(default_factory=dict)
    """The first failure of each kind, as the client saw it (an exception's text)."""
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
    server_closes: int = 0
    retries: int = 0
    retry_after_count: int = 0
    retry_after_max_s: float | None = None
    error_examples: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, parts: Sequence[Part]) -> Tally:
        assert parts
        kinds: Counter[str] = Counter()
        status: Counter[str] = Counter()
        examples: dict[str, str] = {}
        for p in parts:
            kinds.update(p.errors_by_kind)
            status.update(p.errors_by_status)
            for k, v in p.error_examples.items():
                examples.setdefault(k, v)
        ras = [p.retry_after_max_s for p in parts if p.retry_after_max_s is not None]
        return cls(server_closes=sum(p.server_closes for p in parts),
                   retries=sum(p.retries for p in parts),
                   retry_after_count=sum(p.retry_after_count for p in parts),
                   retry_after_max_s=max(ras) if ras else None,
                   error_examples=dict(sorted(examples.items())),
                   sent=sum(p.sent for p in parts), failures=sum(kinds.values()),
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

    def connection_counts(self) -> dict[str, Any]:
        """The `LevelResult` fields of what the client saw of the connections, as keywords."""
        return {"server_closes": self.server_closes, "retries": self.retries,
                "retry_after_count": self.retry_after_count,
                "retry_after_max_s": self.retry_after_max_s,
                "error_examples": self.error_examples}

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
    server_closes: int = 0
    """Connections the server closed or said it would close (each costs a new connect)."""
    retries: int = 0
    """Requests sent once more because the server closed their idle kept-alive connection
    before answering (counted here, not as failures)."""
    retry_after_count: int = 0
    """Refusals (non-2xx) that carried Retry-After: an admission limit speaking."""
    retry_after_max_s: float | None = None
    """The longest Retry-After asked for (seconds)."""
    error_examples: dict[str, str] = field(default_factory=dict)
    """The first failure of each kind as the client saw it."""

    @property
    def answered_share(self) -> float:
        """Successes over requests that ended (1.0 when none did)."""
        done = self.successes + self.failures
        return self.successes / done if done else 1.0

    def healthy(self, availability: float | None = None) -> bool:
        """The server's answers met the availability objective (`DEFAULT_AVAILABILITY`, 99%,
        where none was given): successes / (successes + failures) at least that. Apart from
        `valid` (the generator kept its schedule): a run can be valid and unhealthy (every
        request 404) or the reverse."""
        need = DEFAULT_AVAILABILITY if availability is None else availability
        return self.successes > 0 and self.answered_share >= need

    def all_failed(self) -> bool:
        """Requests were measured and not one succeeded."""
        return self.requests > 0 and self.successes == 0 and self.failures > 0

    def connection_fields(self) -> dict[str, Any]:
        """What the client saw of the server's connections, for the JSON document and records."""
        return {"server_closes": self.server_closes, "retries": self.retries,
                "retry_after": None if not self.retry_after_count else
                {"responses": self.retry_after_count, "max_s": self.retry_after_max_s},
                "error_examples": self.error_examples}

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


def merged_energy(chunks: Sequence[Record], cost: Cost | None) -> Energy | None:
    """The chunks' energy (diagnose.energy tags each chunk's step): joules summed, per unit
    over the merged cost's units; None when a chunk has none (one chunk's joules are not the
    level's)."""
    energies = [c.energy for c in chunks]
    if any(e is None for e in energies):
        return None
    total = sum(e.joules for e in energies if e is not None)
    units = cost.usd / cost.per_unit_usd if cost is not None and cost.per_unit_usd else None
    return Energy(joules=total, per_unit_j=total / units if units else None,
                  unit=chunks[-1].energy.unit if chunks[-1].energy else None,
                  basis="; ".join(dict.fromkeys(e.basis for e in energies if e is not None)))


def merged_extras(chunks: Sequence[Record], *, counts: Sequence[str], kinds: Sequence[str],
                  rates: Sequence[str]) -> tuple[dict[str, Any], float]:
    """The extras every result type adds alike, and the level's wall (the chunks' walls
    summed): `counts` summed, per-kind `kinds` added, per-second `rates` wall-weighted."""
    wall = sum(c.wall_s or 0.0 for c in chunks)
    return {**summed(chunks, counts), **tallies(chunks, kinds),
            **wall_weighted(chunks, rates, wall)}, wall


def chunks_usd(chunks: Sequence[Record]) -> float | None:
    """What the chunks cost together (USD); None when a chunk has no cost (one chunk's cost is
    not the level's). The cost per unit is each result type's own (responses, tokens)."""
    costs = [c.cost for c in chunks]
    if any(cost is None for cost in costs):
        return None
    return sum(cost.usd for cost in costs if cost is not None)


def common_update(chunks: Sequence[Record], extras: dict[str, Any]) -> dict[str, Any]:
    """The record fields every result type merges alike: wall, failures, volume, memory peak,
    ok, errors, the first chunk's timestamp, the resource signals, the last server seen and
    the slices one after another (`extras`: the merged extras, whose "samples" count the
    failure rate is over)."""
    last = chunks[-1]
    failures = sum(c.failures for c in chunks)
    samples = extras.get("samples")
    failures_of = samples if isinstance(samples, int) else None
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
        "slices": chained([c.slices for c in chunks]),
    }


KEY_HINT_HTTP = "pass the credentials with -H 'Authorization: Bearer TOKEN'"
"""What a 401/403 asks of `load` (`load llm` asks for --api-key)."""
KEY_HINT_LLM = "pass --api-key or set OPENAI_API_KEY"


def _status_cause(code: int, *, llm: bool, key_hint: str, retry_after: float | None) -> str:
    if code in (401, 403):
        what = "wants credentials" if code == 401 else "refused the credentials"
        return f"{code}: the server {what}; {key_hint}"
    if code == 404:
        return "404: check the path" + (" (give the server's base URL or --api)" if llm else "")
    if code == 405:
        return "405: the server takes no such method at that path; check the path and --payload"
    if code in (400, 422):
        return (f"{code}: the server rejected the request body; "
                + ("check --api and --model, and try --usage final or --no-ignore-eos for a "
                   "server that rejects vLLM's extra fields" if llm else
                   "check --payload, --body or --model"))
    if code == 501:
        return ("501: the server does not implement this endpoint: is it an OpenAI-compatible "
                "LLM server?" if llm else "501: the server implements nothing at that path")
    if code in (429, 503):
        ra = "" if retry_after is None else f" (Retry-After up to {retry_after:g} s)"
        return (f"{code}: the server refused every request{ra}: an admission limit or an "
                "overload; lower the rate or raise its limit")
    return f"{code}: the server failed every request; see its log"


def likely_cause(r: LevelResult, *, url: str, llm: bool = False) -> str:
    """One line: why every request of `r` failed, from its most common failure (a status,
    else a kind and the first error of that kind the client saw)."""
    key_hint = KEY_HINT_LLM if llm else KEY_HINT_HTTP
    if r.errors_by_status:
        code, _ = max(r.errors_by_status.items(), key=lambda kv: kv[1])
        return _status_cause(int(code), llm=llm, key_hint=key_hint,
                             retry_after=r.retry_after_max_s)
    kinds = {k: v for k, v in r.errors_by_kind.items() if k != "status"}
    if not kinds:
        return "no request succeeded"
    kind = max(kinds.items(), key=lambda kv: kv[1])[0]
    seen = r.error_examples.get(kind, "")
    said = f" ({seen})" if seen else ""
    if kind == "refused":
        return f"connection refused: is the server up at {url}?"
    if kind in ("reset", "dropped"):
        return "the server closed every connection" + (
            " mid-stream" if kind == "dropped" else " before answering") + said
    if kind == "timeout":
        return "every request timed out: the server is stuck or slow; raise --timeout to wait"
    if kind == "tls":
        return (f"the TLS handshake failed{said}; pass --cacert FILE (the CA that signed the "
                "server's certificate) or --insecure")
    if kind == "empty":
        return "every stream carried no token; is it a generation endpoint?"
    return f"{kind}: {seen}" if seen else f"every request failed ({kind})"


def all_failed_line(results: Sequence[LevelResult], *, url: str, llm: bool = False
                    ) -> str | None:
    """When every level's requests all failed: one line with the likely cause; else None."""
    if not results or not all(r.all_failed() for r in results):
        return None
    r = results[0]
    n = sum(x.requests for x in results)
    return f"every request failed ({n} sent): {likely_cause(r, url=url, llm=llm)}"
