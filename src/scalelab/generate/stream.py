"""The Server-Sent Events stream of one request: OpenAI's chunks, usage when asked, [DONE].

OpenAI's shape: chunks (a chat's first carries the role), the finish chunk, then with
`stream_options.include_usage` one chunk with empty `choices` and the usage — the only one
with usage; every other chunk says `usage: null`. vLLM's `continuous_usage_stats` puts the
usage so far in every chunk instead (what scalelab's load tester asks for: exact tokens per
chunk). A deadline or an engine stop mid-stream ends it with an error event, then [DONE].
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from scalelab.generate.logprobs import chat_logprobs, completion_logprobs
from scalelab.generate.loop import Event, Handle
from scalelab.generate.protocol import chunk_doc, error_doc, usage
from scalelab.generate.tokenizer import TextTokenizer


def sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def sse_stream(h: Handle, *, rid: str, chat: bool, model: str, tokenizer: TextTokenizer,
                     include_usage: bool, continuous: bool, as_ids: bool,
                     on_usage: Callable[[int], None],
                     release: Callable[[], None]) -> AsyncIterator[bytes]:
    """OpenAI's stream: chunks, then (include_usage) one chunk with empty `choices` and
    the usage, then [DONE]. With include_usage every other chunk says `usage: null`, or,
    with vLLM's continuous_usage_stats, carries the usage so far."""
    created = int(time.time())
    first = True
    want_lp = h.params.logprobs is not None
    offset = 0  # completions' text_offset continues across chunks
    prompt_tokens = len(h.prompt_ids)

    def out(doc: dict[str, Any], completion: int, cached: int) -> bytes:
        if continuous:
            doc["usage"] = usage(prompt_tokens, completion, cached)
        elif include_usage:
            doc["usage"] = None
        return sse(doc)

    def lp_doc(ev: Event) -> dict[str, Any] | None:
        nonlocal offset
        if not want_lp:
            return None
        if chat:
            return chat_logprobs(tokenizer, ev.logprobs, as_ids=as_ids)
        d = completion_logprobs(tokenizer, ev.logprobs, offset, as_ids=as_ids)
        offset += sum(len(t) for t in d["tokens"])
        return d

    try:
        if chat:
            yield out(chunk_doc(True, rid, model, created, "", None, True), 0, 0)
            first = False
        while True:
            ev = await h.events.get()
            if ev.finish_reason in ("timeout", "error"):
                kind = "timeout" if ev.finish_reason == "timeout" else "server_error"
                yield sse(
                    error_doc(
                        f"generation ended early ({ev.finish_reason}) after "
                        f"{ev.completion_tokens} tokens",
                        kind,
                    )
                )
                break
            lp = lp_doc(ev) if ev.logprobs else None
            if ev.text or lp is not None:
                yield out(chunk_doc(chat, rid, model, created, ev.text, None, first,
                                    lp), ev.completion_tokens, ev.cached_tokens)
                first = False
            if ev.finished:
                use = usage(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
                on_usage(use["total_tokens"])
                last = chunk_doc(chat, rid, model, created, None if chat else "",
                                 ev.finish_reason, first)
                yield out(last, ev.completion_tokens, ev.cached_tokens)
                if include_usage:
                    yield sse({"id": rid, "object": last["object"], "created": created,
                                "model": model, "choices": [], "usage": use})
                break
        yield b"data: [DONE]\n\n"
    finally:
        release()  # also when the client disconnected and the generator was closed


class ReleasingStream(StreamingResponse):
    """A stream that releases its request however it ends: a client that disconnects before
    the first chunk leaves the body generator unstarted, so its `finally` never runs."""

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], None],
                 media_type: str, headers: dict[str, str]) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
