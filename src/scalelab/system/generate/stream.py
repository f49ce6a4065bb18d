"""The Server-Sent Events stream of one request: OpenAI's chunks, usage when asked, [DONE].

OpenAI's shape: chunks (a chat's first carries the role), the finish chunk, then with
`stream_options.include_usage` one chunk with empty `choices` and the usage — the only one
with usage; every other chunk says `usage: null`. vLLM's `continuous_usage_stats` puts the
usage so far in every chunk instead (what scalelab's load tester asks for: exact tokens per
chunk). A deadline or an engine stop mid-stream ends it with an error event, then [DONE].
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from scalelab.system.generate.logprobs import chat_logprobs, completion_logprobs
from scalelab.system.generate.loop import Handle, TextDelta
from scalelab.system.generate.protocol import chunk_doc, error_doc, usage
from scalelab.system.generate.tokenizer import TextTokenizer


def sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def sse_stream(handles: list[Handle], *, rid: str, chat: bool, model: str,
                     tokenizer: TextTokenizer, include_usage: bool, continuous: bool,
                     as_ids: bool, on_usage: Callable[[int], None], echo: str = "",
                     release: Callable[[], None]) -> AsyncIterator[bytes]:
    """OpenAI's stream over one request's `n` choices (one engine sequence each, chunks
    interleaved as they come, each naming its choice `index`): chunks, the finish chunk of
    each choice, then (include_usage) one chunk with empty `choices` and the usage (the prompt
    counted once, the completions summed), then [DONE]. With include_usage every other chunk
    says `usage: null`, or, with vLLM's continuous_usage_stats, carries the usage so far."""
    created = int(time.time())
    n = len(handles)
    first = [True] * n
    want_lp = handles[0].params.logprobs is not None
    offsets = [0] * n  # completions' text_offset continues across a choice's chunks
    generated = [0] * n
    prompt_tokens = len(handles[0].prompt_ids)
    cached = 0
    merged: asyncio.Queue[tuple[int, TextDelta]] = asyncio.Queue()

    async def pump(i: int, h: Handle) -> None:
        while True:
            ev = await h.events.get()
            merged.put_nowait((i, ev))
            if ev.finished:
                return

    def out(doc: dict[str, Any]) -> bytes:
        if continuous:
            doc["usage"] = usage(prompt_tokens, sum(generated), cached)
        elif include_usage:
            doc["usage"] = None
        return sse(doc)

    def lp_doc(i: int, ev: TextDelta) -> dict[str, Any] | None:
        if not want_lp:
            return None
        if chat:
            return chat_logprobs(tokenizer, ev.logprobs, as_ids=as_ids)
        d = completion_logprobs(tokenizer, ev.logprobs, offsets[i], as_ids=as_ids)
        offsets[i] += sum(len(t) for t in d["tokens"])
        return d

    pumps = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    try:
        if chat or echo:  # a chat's role chunk; completions' echoed prompt
            for i in range(n):
                yield out(chunk_doc(chat, rid, model, created, echo, None, True, index=i))
                first[i] = False
        finished = 0
        while finished < n:
            i, ev = await merged.get()
            if ev.finish_reason in ("timeout", "error"):
                kind = "timeout" if ev.finish_reason == "timeout" else "server_error"
                yield sse(error_doc(f"generation ended early ({ev.finish_reason}) after "
                                    f"{ev.completion_tokens} tokens", kind))
                break
            generated[i], cached = ev.completion_tokens, max(cached, ev.cached_tokens)
            lp = lp_doc(i, ev) if ev.logprobs else None
            if ev.text or lp is not None:
                yield out(chunk_doc(chat, rid, model, created, ev.text, None, first[i], lp,
                                    index=i))
                first[i] = False
            if ev.finished:
                finished += 1
                last = chunk_doc(chat, rid, model, created, None if chat else "",
                                 ev.finish_reason, first[i], index=i)
                yield out(last)
        else:
            use = usage(prompt_tokens, sum(generated), cached)
            on_usage(use["total_tokens"])
            if include_usage:
                yield sse({"id": rid, "object": "chat.completion.chunk" if chat else
                           "text_completion", "created": created, "model": model,
                           "choices": [], "usage": use})
        yield b"data: [DONE]\n\n"
    finally:
        for t in pumps:
            t.cancel()
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
