"""W3C Trace Context `traceparent` headers as plain strings (no tracing library needed).

`00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`; flag bit 0 is "sampled". The load
generator mints these for the requests it samples; servers hand the header to the tracing SDK's
propagator (`web.trace`), which reads it by the same rules. All-zero ids are invalid by the spec.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

HEADER = "traceparent"
_FORM = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


@dataclass(frozen=True, kw_only=True)
class TraceParent:
    """One parsed header."""

    trace_id: str
    """32 lowercase hex digits."""
    span_id: str
    """16 lowercase hex digits: the caller's span, the parent of the server's."""
    sampled: bool

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def parse(value: str) -> TraceParent | None:
    """The header's fields, or None when it is malformed (the spec says: ignore it, start a
    new trace). Version ff is forbidden; other versions are read by the version-00 layout."""
    m = _FORM.match(value.strip())
    if m is None or m.group(1) == "ff":
        return None
    _version, trace_id, span_id, flags = m.groups()
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id=trace_id, span_id=span_id, sampled=bool(int(flags, 16) & 1))


def fresh(*, sampled: bool = True) -> TraceParent:
    """A new trace with random ids (os.urandom: unique without a seeded generator's state)."""
    while True:
        raw = os.urandom(24).hex()
        trace_id, span_id = raw[:32], raw[32:]
        if trace_id != _ZERO_TRACE and span_id != _ZERO_SPAN:
            return TraceParent(trace_id=trace_id, span_id=span_id, sampled=sampled)


def with_header(request: bytes, value: str) -> bytes:
    """An encoded HTTP/1.1 request with `traceparent: value` added after its request line (the
    load generator's requests are bytes built once; this copies one of them)."""
    line_end = request.index(b"\r\n") + 2
    return request[:line_end] + f"{HEADER}: {value}\r\n".encode("ascii") + request[line_end:]
