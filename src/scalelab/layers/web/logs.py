"""Server logs: one JSON object per line, each carrying the trace id of the request it is about.

The id a line carries (`trace_id`) is the W3C trace id of the request's `traceparent` when the
caller sent a valid one, or the trace a sampled request started here (web.trace sets it), and
the request id otherwise (the guard's `X-Request-Id`), so one grep finds a request's lines in
every server it crossed. It lives in a context variable set by the guard's `admit` when a
request arrives: every line logged while that request's task runs gets it, whichever logger
writes it; lines about no single request (start-up, a batcher serving many) carry none.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from contextvars import ContextVar
from typing import TextIO

from scalelab.layers.web.traceparent import parse

_TRACE_ID: ContextVar[str] = ContextVar("scalelab_trace_id", default="")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}
SERVER_LOGGERS = ("scalelab", "uvicorn", "uvicorn.error")
"""Our loggers (every part's is a child of "scalelab") and uvicorn's own."""


def bind(request_id: str, traceparent: bytes | None = None) -> None:
    """Name the request now running (its task's context): the traceparent's trace id when
    valid, else `request_id`."""
    tp = parse(traceparent.decode("latin-1")) if traceparent else None
    _TRACE_ID.set(tp.trace_id if tp is not None else request_id)


def bind_trace(trace_id: str) -> None:
    """A trace started here for the running request: its lines carry this id from now on."""
    _TRACE_ID.set(trace_id)


def current_trace_id() -> str:
    """The id lines logged now carry ('' outside a request)."""
    return _TRACE_ID.get()


class TraceIdFilter(logging.Filter):
    """Adds `trace_id` to every record a handler sees (unless the call gave one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "trace_id", ""):
            tid = _TRACE_ID.get()
            if tid:
                record.trace_id = tid
        return True


class JsonFormatter(logging.Formatter):
    """ts, level, logger, msg, then every `extra` field (trace_id, request_id, status, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": round(time.time(), 6), "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        doc.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


def configure(level: str = "info", loggers: Iterable[str] = SERVER_LOGGERS, *,
              stream: TextIO | None = None) -> logging.Handler:
    """Route `loggers` to `stream` (default stderr) as JSON lines with trace ids; the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(TraceIdFilter())
    for name in loggers:
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level.upper())
        lg.propagate = False
    return handler
