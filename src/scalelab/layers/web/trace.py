"""The one tracing layer every server uses: OpenTelemetry spans, head-sampled, to OTLP or JSONL.

Off by default, and off costs one `is None` check per request: a server holds `Tracing | None`
and never calls a tracer when it is None (not even a no-op one). On, head sampling decides once
per request, at its root span: a request with a `traceparent` goes to the SDK's `ParentBased`
sampler, so a client's sampled trace is always followed and an unsampled one never is; a
request without one starts a trace with probability `sample`, drawn here before the SDK is
called at all (the SDK's unsampled root costs ~20 us on this machine under load, a random draw
well under 1). An unsampled request gets no `RequestTrace` and records nothing more.

The root is a live SDK span from arrival (its context is what a response's or an outgoing
call's `traceparent` names); the children are written after the fact from timestamps the
server already keeps (enqueue, pick-up, compute, first token...), as finished spans handed
straight to the span processor: a traced request takes a few clock readings on the hot path
and builds its children as it ends. Servers
keep `time.monotonic()` / `time.perf_counter()`; `ns_mono` / `ns_perf` map them to the epoch
nanoseconds spans carry, through offsets re-read at most once a second.

Export: OTLP/HTTP when an endpoint is given (`opentelemetry-exporter-otlp-proto-http`), else
one JSON object per span per line in a local file (`JsonlSpanExporter`), both behind the SDK's
BatchSpanProcessor (a queue and a background thread; a full queue drops spans rather than block
requests). Needs `pip install 'scalelab[trace]'`; the import is deferred until tracing is on.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.codec import dumps
from scalelab.layers.web.logs import bind_trace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

INSTALL_HINT = "pip install 'scalelab[trace]'"
_TP, _TS = b"traceparent", b"tracestate"
# Offsets from the process's monotonic clocks to the epoch, re-read at most once a second: the
# wall clock is slewed (NTP) against the monotonic ones, so an offset read once at import drifts
# by milliseconds over a server's life, and its spans would start before their parent's in
# another process. A request's spans are converted together when it ends, under one offset.
_REANCHOR_NS = 1_000_000_000
_offsets = {"mono": (time.time_ns() - time.monotonic_ns(), time.monotonic_ns()),
            "perf": (time.time_ns() - time.perf_counter_ns(), time.monotonic_ns())}


def _offset(kind: str, clock_ns: Callable[[], int]) -> int:
    off, at = _offsets[kind]
    now = time.monotonic_ns()
    if now - at > _REANCHOR_NS:
        off = time.time_ns() - clock_ns()
        _offsets[kind] = (off, now)
    return off

Attributes = Mapping[str, Any]
"""Span attributes: str, bool, int, float or a list of one of those."""


def ns_mono(t: float) -> int:
    """Epoch nanoseconds of a `time.monotonic()` reading."""
    return int(t * 1e9) + _offset("mono", time.monotonic_ns)


def ns_perf(t: float) -> int:
    """Epoch nanoseconds of a `time.perf_counter()` reading."""
    return int(t * 1e9) + _offset("perf", time.perf_counter_ns)


@dataclass(kw_only=True, frozen=True)
class TraceConfig:
    """Tracing for one server process (the `--trace-*` flags; JSON-friendly fields only)."""

    sample: float = 0.0
    """Share of requests without a sampled `traceparent` that start a trace, in [0, 1]. A
    client's sampled traceparent is followed whatever this is."""
    out: str | None = None
    """JSON Lines file the spans are appended to (when no OTLP endpoint is given)."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces; wins over `out`."""
    flush_ms: int = 1000
    """Longest a finished span waits in the batch queue before it is exported."""
    max_queue: int = 2048
    """Finished spans held for export (the SDK's default). When the collector is slow or down
    the queue fills and newer spans are dropped, never a request blocked: a dead collector
    costs at most this many spans of memory."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample <= 1.0:
            raise BadUsageError(f"--trace-sample {self.sample} must lie in [0, 1]")
        if self.sample > 0 and not (self.out or self.otlp_endpoint):
            raise BadUsageError("--trace-sample needs somewhere to send spans: "
                                "--trace-out FILE.jsonl or --otlp-endpoint URL")
        if self.otlp_endpoint and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise BadUsageError(f"--otlp-endpoint {self.otlp_endpoint!r} must be an http(s) "
                                "URL, e.g. http://127.0.0.1:4318/v1/traces")
        if self.flush_ms < 1:
            raise BadUsageError("the trace flush interval must be >= 1 ms")
        if self.max_queue < 1:
            raise BadUsageError(f"the trace export queue must hold >= 1 span (got "
                                f"{self.max_queue})")

    @property
    def enabled(self) -> bool:
        """Tracing is on when spans have somewhere to go (even at sample 0, to follow clients'
        sampled traceparents)."""
        return bool(self.out or self.otlp_endpoint)

    @classmethod
    def of(cls, raw: TraceConfig | Mapping[str, Any] | None) -> TraceConfig:
        """From a settings field that travelled through JSON (a dict) or is already one."""
        if raw is None:
            return cls()
        return raw if isinstance(raw, TraceConfig) else cls(**raw)


def available() -> bool:
    """Whether the SDK is installed (callers that can run without traces check first)."""
    import importlib.util

    try:
        return importlib.util.find_spec("opentelemetry.sdk.trace") is not None
    except ModuleNotFoundError:
        return False


@functools.cache
def _otel() -> SimpleNamespace:
    """The SDK's pieces, imported once when tracing is first turned on (never when it is off;
    a per-call import costs a dict lookup and a lock on every span)."""
    try:
        from opentelemetry import trace as api
        from opentelemetry.sdk import trace as sdk
    except ImportError as e:
        raise BadUsageError(f"tracing needs the OpenTelemetry SDK: {INSTALL_HINT}") from e
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return SimpleNamespace(
        api=api, TracerProvider=sdk.TracerProvider, ReadableSpan=sdk.ReadableSpan,
        Resource=Resource, BatchSpanProcessor=BatchSpanProcessor,
        SimpleSpanProcessor=SimpleSpanProcessor, RandomIdGenerator=RandomIdGenerator,
        ALWAYS_ON=ALWAYS_ON, ParentBased=ParentBased, InstrumentationScope=InstrumentationScope,
        Propagator=TraceContextTextMapPropagator, SpanKind=api.SpanKind,
        SpanContext=api.SpanContext, Status=api.Status, StatusCode=api.StatusCode,
        get_current_span=api.get_current_span, set_span_in_context=api.set_span_in_context)


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One span as the JSON Lines exporter writes it (and `observe.traces` reads it)."""
    ctx = span.get_span_context()
    assert ctx is not None  # an SDK span always has one
    parent = span.parent
    status = span.status.status_code.name.lower()
    service = span.resource.attributes.get("service.name") if span.resource else None
    rec: dict[str, Any] = {
        "trace_id": _hex(ctx.trace_id, 32), "span_id": _hex(ctx.span_id, 16),
        "parent_id": _hex(parent.span_id, 16) if parent is not None else None,
        "name": span.name, "kind": span.kind.name.lower(),
        "start_ns": span.start_time, "end_ns": span.end_time,
        "attributes": {k: list(v) if isinstance(v, tuple) else v
                       for k, v in (span.attributes or {}).items()},
        "status": status, "service": service,
    }
    if span.links:
        rec["links"] = [{"trace_id": _hex(lk.context.trace_id, 32),
                         "span_id": _hex(lk.context.span_id, 16)} for lk in span.links]
    return rec


def jsonl_exporter(path: str | Path) -> SpanExporter:
    """A SpanExporter appending one JSON line per span to `path`.

    Each export is one os.write on an O_APPEND descriptor, so several worker processes may
    share the file: the kernel places each write whole at the end (local file systems)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonlSpanExporter(SpanExporter):
        def __init__(self) -> None:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self.path = p
            self._fd: int | None = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._lock = threading.Lock()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            data = b"".join(dumps(span_record(s)) + b"\n" for s in spans)
            with self._lock:
                if self._fd is None:
                    return SpanExportResult.FAILURE
                os.write(self._fd, data)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            with self._lock:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return JsonlSpanExporter()


class Tracing:
    """One server process's tracer: its provider, sampler and exporter.

    `exporter` replaces the configured one (tests pass the SDK's InMemorySpanExporter and get
    a synchronous processor, so spans are readable as soon as a request ends)."""

    def __init__(self, cfg: TraceConfig, service: str, *,
                 exporter: SpanExporter | None = None) -> None:
        self.o = o = _otel()
        self.cfg = cfg
        self.service = service
        # A provider of our own, not the global one: two servers in one process (tests) or a
        # user's own OpenTelemetry setup never see each other's spans.
        # roots reach the SDK only once `begin` has drawn them, so its root sampler takes all
        self.provider = o.TracerProvider(
            sampler=o.ParentBased(o.ALWAYS_ON),
            resource=o.Resource.create({"service.name": service}), shutdown_on_exit=False)
        self.processor: SpanProcessor = (
            o.SimpleSpanProcessor(exporter) if exporter is not None else
            o.BatchSpanProcessor(self._exporter(cfg), schedule_delay_millis=cfg.flush_ms,
                                 max_queue_size=cfg.max_queue,
                                 max_export_batch_size=min(512, cfg.max_queue)))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("scalelab")
        self.resource = self.provider.resource
        self.scope = o.InstrumentationScope("scalelab")
        self.new_span_id = o.RandomIdGenerator().generate_span_id
        self._propagator = o.Propagator()
        self._closed = False
        self._draw = random.Random().random
        self._sample = cfg.sample

    @staticmethod
    def _exporter(cfg: TraceConfig) -> SpanExporter:
        if cfg.otlp_endpoint:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError as e:
                raise BadUsageError(f"--otlp-endpoint needs the OTLP exporter: {INSTALL_HINT}"
                                    ) from e
            exp: SpanExporter = OTLPSpanExporter(endpoint=cfg.otlp_endpoint)
            return exp
        assert cfg.out is not None
        return jsonl_exporter(cfg.out)

    @classmethod
    def build(cls, cfg: TraceConfig, service: str) -> Tracing | None:
        """The tracer for `cfg`, or None when tracing is off (what servers keep and test)."""
        return cls(cfg, service) if cfg.enabled else None

    def begin(self, name: str, headers: Iterable[tuple[bytes, bytes]], start_ns: int, *,
              attributes: Attributes | None = None) -> RequestTrace | None:
        """Ask the sampler about one request (its ASGI headers carry any traceparent); a
        `RequestTrace` to record into when sampled, else None (nothing more to do)."""
        o = self.o
        carrier: dict[str, str] | None = None
        for k, v in headers:
            if k in (_TP, _TS):
                if carrier is None:
                    carrier = {}
                carrier[k.decode()] = v.decode("latin-1")
        parent = None
        if carrier is not None:
            ctx = self._propagator.extract(carrier)
            if o.get_current_span(ctx).get_span_context().is_valid:  # else malformed: a root
                parent = ctx
        if parent is None and (self._sample <= 0.0 or (
                self._sample < 1.0 and self._draw() >= self._sample)):
            return None
        span = self.tracer.start_span(name, context=parent, kind=o.SpanKind.SERVER,
                                      attributes=attributes, start_time=start_ns)
        if not span.is_recording():
            return None
        return RequestTrace(self, span)

    @property
    def queued(self) -> int | None:
        """Spans waiting in the batch processor's queue now (at most `cfg.max_queue`); None
        with a synchronous exporter. Reads the SDK's private queue: a health probe for tests
        and debugging, not an API the SDK promises."""
        q = getattr(getattr(self.processor, "_batch_processor", None), "_queue", None)
        return len(q) if q is not None else None

    def flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        """Export what is queued and close the exporter (the server's lifespan end)."""
        if not self._closed:
            self._closed = True
            self.provider.shutdown()


class RequestTrace:
    """The spans of one sampled request: a root (server) span and children under it."""

    def __init__(self, tracing: Tracing, root: Span) -> None:
        self.tracing = tracing
        self.o = tracing.o
        self.root = root
        self._ctx = self.o.set_span_in_context(root)
        c = root.get_span_context()
        self.trace_id = _hex(c.trace_id, 32)
        self.span_id = _hex(c.span_id, 16)
        # A trace started here (no traceparent came): the request's log lines name it too.
        bind_trace(self.trace_id)

    def traceparent(self, span: Span | None = None) -> str:
        """The header naming `span` (default: the root) as the parent of a downstream call."""
        c = (span or self.root).get_span_context()
        return f"00-{_hex(c.trace_id, 32)}-{_hex(c.span_id, 16)}-01"

    def span(self, name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None,
             *, parent: Span | None = None) -> None:
        """Record a finished phase of this request (start and end already known).

        Built as a finished `ReadableSpan` and handed to the span processor: a sampled root's
        children are sampled by definition, and the SDK's live-span path (sampler, context
        lookups, locks, attribute cleaning) cost ~150 us a span on this busy machine, six
        times per request."""
        up = (parent or self.root).get_span_context()
        t, o = self.tracing, self.o
        ctx = o.SpanContext(up.trace_id, t.new_span_id(), is_remote=False,
                            trace_flags=up.trace_flags, trace_state=up.trace_state)
        t.processor.on_end(o.ReadableSpan(
            name, context=ctx, parent=up, resource=t.resource, attributes=dict(attributes or {}),
            start_time=start_ns, end_time=max(start_ns, end_ns), instrumentation_scope=t.scope))

    def start(self, name: str, *, client: bool = False, attributes: Attributes | None = None,
              start_ns: int | None = None) -> Span:
        """Open a span now (end it with `.end()`): for a call whose traceparent must name it,
        e.g. a request to another server."""
        kind = self.o.SpanKind
        return self.tracing.tracer.start_span(
            name, context=self._ctx, kind=kind.CLIENT if client else kind.INTERNAL,
            attributes=attributes, start_time=start_ns)

    def end(self, status: int, end_ns: int | None = None,
            attributes: Attributes | None = None) -> None:
        """Close the root with the HTTP status (5xx marks the trace as an error)."""
        o = self.o
        root = self.root
        root.set_attribute("http.response.status_code", status)
        if attributes:
            root.set_attributes(attributes)
        if status >= 500:
            root.set_status(o.Status(o.StatusCode.ERROR, f"HTTP {status}"))
        root.end(end_time=end_ns)
