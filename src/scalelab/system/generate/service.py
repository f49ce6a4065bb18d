"""The generative server as an object: `GenerationService` holds the engine, its thread, the
admission count and the tracing hook, and has one handler method per route; `generate.app`
registers them on the app (URLs there) and puts the app behind the shared hook (web.hook).

The handlers take what FastAPI hands a route (the parsed body, the `Request`) and return a
dict or a `Response`, or raise `HttpError` (OpenAI's error body with its status): a test calls
them directly, without a socket (`web.hook.local_request`). The vLLM extras: /tokenize takes a
`prompt` (BOS prepended by default, as for /v1/completions) or `messages` (rendered by the chat
template, no BOS of our own, as for /v1/chat/completions), so a client counts exactly the
tokens a request will cost; /detokenize turns ids back into text; /version names the build.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import scalelab
from scalelab.lab.core.errors import BadInputError
from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.governance.middleware import report_usage
from scalelab.layers.web.hook import Hook, Inflight
from scalelab.system.generate import spans
from scalelab.system.generate.engine import LlmEngine
from scalelab.system.generate.logprobs import chat_logprobs, completion_logprobs
from scalelab.system.generate.loop import EngineLoop, Handle, TextDelta
from scalelab.system.generate.protocol import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    FieldError,
    TokenizeRequest,
    chat_choice,
    chat_doc,
    completion_choice,
    completion_doc,
    usage,
)
from scalelab.system.generate.sequence import SamplingParams, TokenLogprob
from scalelab.system.generate.settings import ApiSettings
from scalelab.system.generate.stream import ReleasingStream, sse_stream


class GenerationService:
    """The app's state (engine, its thread, the admission count, tracing) and its handlers.
    Handler methods keep the names FastAPI derives operation ids from (/openapi.json)."""

    def __init__(self, settings: ApiSettings, engine: LlmEngine) -> None:
        self.settings = settings
        self.engine = engine
        self.loop = EngineLoop(engine)
        self.inflight = Inflight(engine.cfg.max_num_seqs + settings.max_waiting)
        """Sequences running or waiting (a request of n choices counts n)."""
        self.limit = self.inflight.limit
        self.max_prompt = settings.max_prompt_tokens or engine.cfg.max_model_len - 1
        self.hook = Hook(settings.trace, "scalelab-generate")

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.loop.start()
        yield
        self.loop.stop()
        self.hook.shutdown()

    # -- the checks every generation request passes ---------------------------------------

    def params(
        self, req: CompletionRequest | ChatRequest, max_tokens: int | None, default: int
    ) -> SamplingParams:
        s = self.settings
        n = max_tokens if max_tokens is not None else default
        if n > s.max_output_tokens:
            raise HttpError(
                400,
                f"max_tokens={n} is over this server's max_output_tokens="
                f"{s.max_output_tokens}; ask for fewer",
                param="max_tokens",
            )
        try:
            return SamplingParams(
                max_tokens=n,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=req.seed,
                stop=req.stops(),
                ignore_eos=req.ignore_eos,
                presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty,
                logit_bias=req.bias(self.engine.tokenizer.vocab_size),
                logprobs=req.logprobs if isinstance(req, CompletionRequest) else
                req.num_logprobs(),
            )
        except BadInputError as e:
            raise HttpError(400, str(e), param="stop") from e

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.engine.name:
            raise HttpError(
                404,
                f"model {model!r} does not exist; this server serves "
                f"{self.engine.name!r} (see GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def model_card(self) -> dict[str, Any]:
        return {"id": self.engine.name, "object": "model", "created": 0, "owned_by": "scalelab",
                "root": self.engine.name, "parent": None,
                "max_model_len": self.engine.cfg.max_model_len}

    def chat_ids(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                 kwargs: dict[str, Any] | None = None, *,
                 add_special_tokens: bool = False) -> list[int]:
        """The prompt ids of a chat: the template's text, tokenized without a BOS of our own
        (the template writes `bos_token` where the model wants it), as vLLM does."""
        tok = self.engine.tokenizer
        try:
            text = tok.render_chat(messages, add_generation_prompt=add_generation_prompt,
                                   kwargs=kwargs)
        except BadInputError as e:
            raise HttpError(400, str(e), param="messages") from e
        return tok.encode(text, add_special_tokens=add_special_tokens)

    def check(self, model: str, prompt_ids: list[int], params: SamplingParams,
              n: int = 1) -> None:
        self.check_model(model)
        if n > self.limit:
            raise HttpError(400, f"n={n} choices can never be admitted: this server holds "
                           f"{self.limit} sequences (--max-num-seqs + --max-waiting)",
                           param="n")
        if len(prompt_ids) > self.max_prompt:
            raise HttpError(
                400,
                f"the prompt has {len(prompt_ids)} tokens; max_prompt_tokens is "
                f"{self.max_prompt}: shorten it",
                param="prompt",
                code="context_length_exceeded",
            )
        try:
            self.engine.check_lengths(len(prompt_ids), params.max_tokens)
        except BadInputError as e:
            raise HttpError(400, str(e), param="max_tokens", code="context_length_exceeded") from e
        if not self.loop.alive:
            raise HttpError(503, "the engine has stopped; see the server log", "server_error")
        if self.inflight.full(n):
            raise HttpError(
                429,
                f"{self.inflight.count} requests are running or waiting (the limit"
                f" is {self.limit}); retry later",
                "rate_limit_exceeded",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )

    # -- probes, listings and the vLLM extras (no docstrings: FastAPI would publish them) --

    async def health(self) -> Response:  # GET /health
        if not self.loop.alive:
            return JSONResponse({"status": "engine stopped"}, 503)
        return JSONResponse({"status": "ok"})

    async def models(self) -> dict[str, Any]:  # GET /v1/models
        return {"object": "list", "data": [self.model_card()]}

    async def model(self, model_id: str) -> dict[str, Any]:  # GET /v1/models/{id}
        self.check_model(model_id)
        return self.model_card()

    async def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:  # POST /tokenize
        self.check_model(body.model)
        tok = self.engine.tokenizer
        if (body.prompt is None) == (body.messages is None):
            raise FieldError("prompt", "send either prompt or messages (one of them)")
        if body.messages is not None:
            if not body.messages:
                raise FieldError("messages", "messages is empty")
            msgs = [m.for_template(f"messages.{i}") for i, m in enumerate(body.messages)]
            ids = self.chat_ids(msgs, body.add_generation_prompt, body.chat_template_kwargs,
                                add_special_tokens=bool(body.add_special_tokens))
        else:
            assert body.prompt is not None
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = tok.encode(body.prompt, add_special_tokens=add)
        strs = ([tok.token_bytes(i).decode("utf-8", errors="replace") for i in ids]
                if body.return_token_strs else None)
        return {"count": len(ids), "max_model_len": self.engine.cfg.max_model_len,
                "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: DetokenizeRequest) -> dict[str, Any]:  # POST /detokenize
        self.check_model(body.model)
        tok = self.engine.tokenizer
        bad = [t for t in body.tokens if not 0 <= t < tok.vocab_size]
        if bad:
            raise FieldError("tokens", f"token ids must lie in [0, {tok.vocab_size}); got "
                             f"{bad[:5]}")
        return {"prompt": tok.decode(body.tokens)}

    async def version(self) -> dict[str, str]:  # GET /version
        return {"version": scalelab.__version__}

    async def metrics(self) -> Response:  # GET /metrics
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        m = self.engine.metrics
        body = generate_latest(m.registry) if m else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def pool(self) -> dict[str, Any]:
        """Block-pool state (what the fault tests assert returns to whole)."""
        engine = self.engine
        b = engine.blocks
        try:
            problems = b.problems()
        except RuntimeError:  # the engine thread changed the free queue while we read it
            problems = ["read while the engine was changing it; ask again"]
        return {
            "num_blocks": b.num_blocks,
            "free": b.num_free,
            "used": b.num_used,
            "whole": b.num_free == b.num_blocks and not problems,
            "problems": problems,
            "cached_blocks": len(b.cached),
            "outstanding": self.inflight.count,
            "live": self.loop.num_live,
            "running": engine.num_running,
            "waiting": engine.num_waiting,
            "prefix_hit_rate": b.stats.hit_rate,
            "preemptions": engine.scheduler.num_preemptions,
            "spec_acceptance": engine.stats.acceptance_rate,
        }

    # -- generation ---------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        body.refuse_unsupported()
        tok = self.engine.tokenizer
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise HttpError(400, "one prompt per request: send a string (or one request "
                               "per prompt)", param="prompt")
            p = p[0]
        if isinstance(p, str):
            ids = tok.encode(p)
        else:
            ids = [int(t) for t in p]
            if any(not 0 <= t < tok.vocab_size for t in ids):
                raise HttpError(
                    400,
                    f"prompt token ids must lie in [0, {tok.vocab_size})",
                    param="prompt",
                )
        if not ids:
            raise HttpError(400, "the prompt is empty", param="prompt")
        params = self.params(body, body.max_tokens, self.settings.default_max_tokens)
        echo = (p if isinstance(p, str) else tok.decode(ids)) if body.echo else ""
        return await self.serve(body, request, ids, params, chat=False, echo=echo)

    async def chat(self, body: ChatRequest, request: Request) -> Response:
        body.refuse_unsupported()
        ids = self.chat_ids(body.template_messages(), body.add_generation_prompt,
                            body.chat_template_kwargs)
        n = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else (body.max_tokens)
        )
        s = self.settings
        default = min(s.default_chat_max_tokens, s.max_output_tokens)
        params = self.params(body, n, default)
        return await self.serve(body, request, ids, params, chat=True)

    async def serve(
        self,
        body: CompletionRequest | ChatRequest,
        request: Request,
        ids: list[int],
        params: SamplingParams,
        chat: bool,
        echo: str = "",
    ) -> Response:
        """Admit, submit the n choices and answer them streamed or whole. echo: text every
        choice starts with (completions' `echo`: the prompt)."""
        g = spans.begin(self.hook, request, chat=chat, model=body.model, params=params,
                        stream=bool(body.stream))
        n = body.n
        try:
            self.check(body.model, ids, params, n)
        except HttpError as e:
            spans.refused(g, e.status)
            raise
        spans.admitted(g)
        s = self.settings
        timeout = min(body.timeout or s.request_timeout_s, s.request_timeout_s)
        handles: list[Handle] = []
        try:
            for i in range(n):
                # seeded choices differ from each other and repeat as a whole
                p = params if i == 0 or params.seed is None else replace(params,
                                                                         seed=params.seed + i)
                handles.append(self.loop.submit(ids, p, timeout))
                self.inflight.enter()
        except BaseException:
            for h in handles:
                self.release(h)
            raise
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        spans.submitted(g, rid, handles[0])

        def release_all() -> None:
            for h in handles:
                self.release(h)

        engine = self.engine
        if body.stream:
            so = body.stream_options
            include = bool(so and so.include_usage)
            continuous = bool(include and so and so.continuous_usage_stats)
            scope = request.scope
            return ReleasingStream(
                sse_stream(handles, rid=rid, chat=chat, model=engine.name,
                           tokenizer=engine.tokenizer, include_usage=include,
                           continuous=continuous, as_ids=body.return_tokens_as_token_ids,
                           echo=echo, on_usage=lambda k: report_usage(scope, "tokens", k),
                           release=release_all),
                on_close=release_all,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", **spans.headers(g)},
            )
        resp = await self.whole(handles, rid, chat, request, body.return_tokens_as_token_ids,
                                release_all, echo)
        resp.headers.update(spans.headers(g))
        return resp

    def release(self, h: Handle) -> None:
        """Give a choice's sequence back (once): aborted in the engine if still running, its
        admission slot freed, its spans written."""
        if h.released:
            return
        h.released = True
        self.loop.abort(h)  # no-op when it already finished
        self.inflight.leave()
        spans.finish(h.trace, h.seq, model=self.engine.name)

    async def whole(self, handles: list[Handle], rid: str, chat: bool, request: Request,
                    as_ids: bool, release_all: Callable[[], None], echo: str) -> Response:
        """Wait for every choice (or the client leaving: 499) and answer one document."""
        texts: list[list[str]] = [[] for _ in handles]
        lps: list[list[TokenLogprob]] = [[] for _ in handles]

        async def collect(i: int, h: Handle) -> TextDelta:
            while True:
                ev = await h.events.get()
                texts[i].append(ev.text)
                lps[i].extend(ev.logprobs)
                if ev.finished:
                    return ev

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work: asyncio.Future[list[TextDelta]] = asyncio.ensure_future(
            asyncio.gather(*(collect(i, h) for i, h in enumerate(handles))))
        watch = asyncio.ensure_future(gone())
        either: set[asyncio.Future[Any]] = {work, watch}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
            release_all()
        if not work.done() or work.cancelled():
            return Response(status_code=499)  # nobody is listening any more
        evs: list[TextDelta] = work.result()
        for ev in evs:
            if ev.finish_reason == "timeout":
                raise HttpError(
                    504,
                    f"the request's deadline passed after {ev.completion_tokens} tokens",
                    "timeout",
                )
            if ev.finish_reason == "error":
                raise HttpError(503, "the engine stopped while generating", "server_error")
        # the prompt is counted once however many choices share it (OpenAI's usage)
        use = usage(evs[0].prompt_tokens, sum(ev.completion_tokens for ev in evs),
                    max(ev.cached_tokens for ev in evs))
        report_usage(request.scope, "tokens", use["total_tokens"])
        tok = self.engine.tokenizer
        want_lp = handles[0].params.logprobs is not None
        choices = []
        for i, ev in enumerate(evs):
            text = echo + "".join(texts[i])
            if chat:
                lp = chat_logprobs(tok, lps[i], as_ids=as_ids) if want_lp else None
                choices.append(chat_choice(i, text, ev.finish_reason, lp))
            else:
                lp = completion_logprobs(tok, lps[i], as_ids=as_ids) if want_lp else None
                choices.append(completion_choice(i, text, ev.finish_reason, lp))
        doc = (chat_doc if chat else completion_doc)(rid, self.engine.name, choices, use)
        return JSONResponse(doc)
