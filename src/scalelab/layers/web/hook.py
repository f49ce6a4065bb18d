"""The one hook every request of every server goes through, and a request made without a socket.

A server is a small service object: its state in attributes, one handler method per route
(`RetrievalService.retrieve`, `GenerationService.completions`, ...), and a thin builder that
registers the methods on a Starlette/FastAPI app and puts the app behind this hook. From the
socket inwards a request meets:

1. governance (`web.governance`; only when a governance file is given): for the requests the
   server calls work (`work(scope)` names the model), rate limits per client, budgets per
   client and model, kill switches; a refusal is answered here (429 + Retry-After, 503, 403)
   and never reaches the app. It also serves `/admin/governance` and appends its families to
   `/metrics`. What a handler reports with `report_usage` (tokens) is charged when it ends.
2. admission (`web.guard.Guard`): the request id (accepted or made, echoed), the body limit
   (413, declared or counted while read), the request and trace ids bound to every log line,
   one access-log line per request.
3. the server's own bound (`Inflight`): at most `limit` requests (or sequences) worked on at
   once; the next is refused at once (503 or 429 with Retry-After), never queued without bound.
4. tracing (`Hook`): a root span per sampled request (head-sampled in `web.trace`), children
   written after the fact from timestamps, `traceparent` on the response and on calls to other
   servers. Off, the hook holds no tracer and each call is one `is None` test inside the hook:
   handlers never branch on it.
5. the handler method. A handler takes a Starlette `Request` (or FastAPI's parsed body), so a
   test calls it directly with `local_request(...)`: no socket, no server, no TestClient.

The tabular server (`serve.app`) meets 1 and 2 the same way; its infer route is a bare ASGI
handler that applies the guard's checks itself (`web.guard.admit`) for speed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message

from scalelab.layers.web.access import AccessLog
from scalelab.layers.web.governance.config import GovernanceConfig
from scalelab.layers.web.governance.middleware import Route, governed
from scalelab.layers.web.guard import ErrorBody, Guard, json_error
from scalelab.layers.web.trace import Attributes, RequestTrace, TraceConfig, Tracing, ns_perf

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from starlette.responses import Response


def admitted(app: ASGIApp, *, max_body: int, access: AccessLog | None,
             governance: GovernanceConfig | Path | str | None, work: Route,
             admin_token: str | None, error_body: ErrorBody = json_error) -> ASGIApp:
    """`app` behind admission (the guard) and, when configured, governance (layers 1-2)."""
    return governed(Guard(app, max_body=max_body, error_body=error_body, access=access),
                    governance, route=work, admin_token=admin_token, error_body=error_body)


class Inflight:
    """The server's own bound on work in hand: `limit` units (requests, or sequences) at once.
    Not a lock: the event loop's thread is the only one that counts."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"an in-flight limit of {limit} admits nothing; give >= 1")
        self.limit = limit
        self.count = 0

    def full(self, n: int = 1) -> bool:
        """Whether `n` more would pass the limit."""
        return self.count + n > self.limit

    def enter(self, n: int = 1) -> None:
        self.count += n

    def leave(self, n: int = 1) -> None:
        self.count -= n


class Call:
    """An outgoing call to another server under a request's trace: the headers to send (its
    `traceparent`, when traced) and the status it answered."""

    def __init__(self, trace: RequestTrace | None, span: Span | None) -> None:
        self._span = span
        self.headers: dict[str, str] = (
            {"traceparent": trace.traceparent(span)} if trace is not None and span is not None
            else {})

    def status(self, code: int) -> None:
        if self._span is not None:
            self._span.set_attribute("http.response.status_code", code)


class Hook:
    """A server's tracing (layer 4): every call takes the request's `RequestTrace | None` and
    does nothing for an untraced one."""

    def __init__(self, trace: TraceConfig, service: str) -> None:
        self.tracing: Tracing | None = Tracing.build(trace, service)
        """None when tracing is off (what `app.state.tracing` shows, for tests to flush)."""

    def begin(self, request: Request, name: str, start: float,
              attributes: Attributes | None = None) -> RequestTrace | None:
        """The request's root span, started at `start` (perf_counter), when tracing is on and
        the sampler takes it; kept in `request.state.trace` for the handler."""
        if self.tracing is None:
            return None
        trace = self.tracing.begin(name, request.scope["headers"], ns_perf(start),
                                   attributes=attributes)
        if trace is not None:
            request.state.trace = trace
        return trace

    @staticmethod
    def of(request: Request) -> RequestTrace | None:
        """The trace `begin` started for this request (None when untraced)."""
        return getattr(request.state, "trace", None)

    @staticmethod
    def end(trace: RequestTrace | None, response: Response) -> Response:
        """Name the root in the response's `traceparent` and close it with the status."""
        if trace is not None:
            response.headers["traceparent"] = trace.traceparent()
            trace.end(response.status_code)
        return response

    @staticmethod
    def child(trace: RequestTrace | None, name: str, start: float, end: float,
              attributes: Attributes | None = None) -> None:
        """A finished phase (perf_counter readings) under the root."""
        if trace is not None:
            trace.span(name, ns_perf(start), ns_perf(end), attributes)

    @staticmethod
    @contextmanager
    def call(trace: RequestTrace | None, name: str,
             attributes: Attributes | None = None) -> Iterator[Call]:
        """A client span open while the block calls another server (whose spans then join
        this trace through `Call.headers`)."""
        span = None if trace is None else trace.start(name, client=True, attributes=attributes)
        try:
            yield Call(trace, span)
        finally:
            if span is not None:
                span.end()

    def shutdown(self) -> None:
        """Export the spans still queued (the server's lifespan end)."""
        if self.tracing is not None:
            self.tracing.shutdown()


def local_request(method: str, path: str, *, json_body: Any = None, body: bytes | None = None,
                  headers: dict[str, str] | None = None) -> Request:
    """A request as a handler method sees it, made without a socket: the body is delivered
    once, then the client stays connected (a handler that watches for a disconnect waits)."""
    raw = body if body is not None else (
        b"" if json_body is None else json.dumps(json_body).encode())
    hdrs = [(k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in (headers or {}).items()]
    if json_body is not None:
        hdrs.append((b"content-type", b"application/json"))
    hdrs.append((b"content-length", str(len(raw)).encode()))
    path_only, _, query = path.partition("?")
    scope: dict[str, Any] = {"type": "http", "method": method.upper(), "path": path_only,
             "raw_path": path_only.encode(), "query_string": query.encode(), "headers": hdrs,
             "scheme": "http", "server": ("127.0.0.1", 0), "client": ("127.0.0.1", 0),
             "root_path": "", "http_version": "1.1", "state": {}, "app": None}
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # connected until the handler gives up
        raise AssertionError("unreachable")

    return Request(scope, receive)
