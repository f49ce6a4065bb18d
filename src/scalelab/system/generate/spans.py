"""The generative server's spans: admission, queue, prefill and decode under one request span,
with OpenTelemetry's `gen_ai.*` attribute names.

The engine already stamps each sequence (`scheduled_at`, `first_token_at`, `last_token_at`, on
`time.perf_counter()`), so the spans are written once the request is released, from those
stamps: the engine thread does nothing more for a traced request than for any other. Queue
runs from submission to the first step that scheduled the sequence; prefill from there to its
first token (every chunk of a chunked prefill, and any wait between chunks); decode from the
first token to the last. A preempted sequence recomputes inside these spans (its count is an
attribute).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from scalelab.layers.web.hook import Hook
from scalelab.layers.web.trace import RequestTrace, ns_perf
from scalelab.system.generate.loop import Handle
from scalelab.system.generate.sequence import SamplingParams, Sequence

STATUS_OF = {"timeout": 504, "error": 503, "abort": 499}
"""HTTP status a request ended with, by finish reason (others: 200)."""


@dataclass(eq=False, kw_only=True)
class GenTrace:
    """One sampled generation request on its way through the engine."""

    rt: RequestTrace
    start: float
    """perf_counter at the request's arrival in the handler."""
    submitted: float = 0.0
    response_id: str = ""


def begin(hook: Hook, request: Request, *, chat: bool, model: str, params: SamplingParams,
          stream: bool) -> GenTrace | None:
    """Ask the sampler (through the server's hook); a GenTrace when this request is traced,
    None when it is not or tracing is off (every function here then does nothing). The span
    is named '{operation} {model}' as the gen_ai conventions ask."""
    if hook.tracing is None:  # off: not even the attributes are built
        return None
    start = time.perf_counter()
    op = "chat" if chat else "text_completion"
    rt = hook.begin(request, f"{op} {model}", start, {
        "gen_ai.operation.name": op, "gen_ai.provider.name": "scalelab",
        "gen_ai.request.model": model, "gen_ai.request.max_tokens": params.max_tokens,
        "gen_ai.request.temperature": params.temperature, "gen_ai.request.top_p": params.top_p,
        "http.request.method": "POST", "http.route": str(request.scope.get("path", "")),
        "scalelab.stream": stream})
    return None if rt is None else GenTrace(rt=rt, start=start)


def refused(g: GenTrace | None, status: int) -> None:
    """The admission checks refused the request: close it with their status."""
    if g is not None:
        g.rt.end(status)


def admitted(g: GenTrace | None) -> None:
    """The admission checks passed and the request goes to the engine now."""
    if g is not None:
        g.submitted = time.perf_counter()
        g.rt.span("admission", ns_perf(g.start), ns_perf(g.submitted))


def submitted(g: GenTrace | None, response_id: str, first: Handle) -> None:
    """The request's sequences are in the engine; the first one's release closes the trace."""
    if g is not None:
        g.response_id, first.trace = response_id, g


def headers(g: GenTrace | None) -> dict[str, str]:
    """The response's `traceparent` (none when untraced)."""
    return {} if g is None else {"traceparent": g.rt.traceparent()}


def finish(g: GenTrace | None, seq: Sequence | None, *, model: str,
           status: int | None = None) -> None:
    """Write queue / prefill / decode from the sequence's stamps and close the request."""
    if g is None:
        return
    end = time.perf_counter()
    rt = g.rt
    attrs: dict[str, Any] = {"gen_ai.response.id": g.response_id, "gen_ai.response.model": model}
    if seq is not None:
        sched, first, last = seq.scheduled_at, seq.first_token_at, seq.last_token_at
        if sched is not None:
            rt.span("queue", ns_perf(g.submitted), ns_perf(sched))
            prefill_end = first if first is not None else end
            rt.span("prefill", ns_perf(sched), ns_perf(prefill_end), {
                "gen_ai.usage.input_tokens": seq.num_prompt,
                "scalelab.prefix_cache.hit_tokens": seq.cached_prompt_tokens})
            if first is not None and last is not None and seq.num_output > 1:
                rt.span("decode", ns_perf(first), ns_perf(last),
                        {"gen_ai.usage.output_tokens": seq.num_output})
        reason = seq.finish_reason or "abort"
        attrs.update({"gen_ai.usage.input_tokens": seq.num_prompt,
                      "gen_ai.usage.output_tokens": seq.num_output,
                      "gen_ai.response.finish_reasons": [reason],
                      "scalelab.preemptions": seq.preemptions})
        if status is None:
            status = STATUS_OF.get(reason, 200)
    rt.end(status or 200, ns_perf(end), attrs)
