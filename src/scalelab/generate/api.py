"""The OpenAI-compatible HTTP API over the engine: /v1/completions, /v1/chat/completions (both
streaming as Server-Sent Events), /v1/models, /health, /metrics, and vLLM's /tokenize,
/detokenize and /version (generate.endpoints). With an API key, /v1/* needs it as a Bearer
token (generate.auth).

Admission: at most max_num_seqs running plus max_waiting waiting requests are held; the next
one gets 429 with Retry-After at once instead of an unbounded queue. Every request carries a
deadline; a prompt over max_prompt_tokens or a max_tokens over max_output_tokens is a 400 that
names the limit. A client that goes away (mid-stream or while waiting for a whole answer) is
aborted in the engine, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Scope

from scalelab.core.errors import BadInputError
from scalelab.generate import spans
from scalelab.generate.auth import API_KEY_ENV, ApiKeyGuard
from scalelab.generate.endpoints import add_endpoints
from scalelab.generate.engine import Engine, EngineConfig
from scalelab.generate.logprobs import chat_logprobs, completion_logprobs
from scalelab.generate.loop import EngineLoop, Event, Handle
from scalelab.generate.metrics import EngineMetrics
from scalelab.generate.protocol import (
    ChatRequest,
    CompletionRequest,
    FieldError,
    chat_choice,
    chat_doc,
    completion_choice,
    completion_doc,
    error_doc,
    usage,
)
from scalelab.generate.sequence import SamplingParams, TokenLogprob
from scalelab.generate.settings import SETTINGS_ENV, ApiSettings
from scalelab.generate.stream import ReleasingStream, sse_stream
from scalelab.web.access import AccessLog
from scalelab.web.governance import governed, report_usage
from scalelab.web.guard import Guard
from scalelab.web.trace import Tracing

ADMIN_TOKEN_ENV = "SCALELAB_ADMIN_TOKEN"
WORK_ROUTES = ("/v1/completions", "/v1/chat/completions")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )
        self.headers = headers


_ERROR_TYPES = {401: "authentication_error", 403: "permission_error",
                429: "rate_limit_exceeded", 503: "server_error"}
"""OpenAI's error type for the statuses the guard and governance answer (else a bad request)."""


def _error_body(status: int, message: str) -> bytes:
    return json.dumps(error_doc(message, _ERROR_TYPES.get(status, "invalid_request_error"))
                      ).encode()


class Service:
    """The app's state: engine, its thread, and the admission count."""

    def __init__(self, settings: ApiSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.loop = EngineLoop(engine)
        self.outstanding = 0
        self.limit = engine.cfg.max_num_seqs + settings.max_waiting
        self.max_prompt = settings.max_prompt_tokens or engine.cfg.max_model_len - 1

    def params(
        self, req: CompletionRequest | ChatRequest, max_tokens: int | None, default: int
    ) -> SamplingParams:
        s = self.settings
        n = max_tokens if max_tokens is not None else default
        if n > s.max_output_tokens:
            raise ApiError(
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
            raise ApiError(400, str(e), param="stop") from e

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.engine.name:
            raise ApiError(
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
            raise ApiError(400, str(e), param="messages") from e
        return tok.encode(text, add_special_tokens=add_special_tokens)

    def check(self, model: str, prompt_ids: list[int], params: SamplingParams,
              n: int = 1) -> None:
        self.check_model(model)
        if n > self.limit:
            raise ApiError(400, f"n={n} choices can never be admitted: this server holds "
                           f"{self.limit} sequences (--max-num-seqs + --max-waiting)",
                           param="n")
        if len(prompt_ids) > self.max_prompt:
            raise ApiError(
                400,
                f"the prompt has {len(prompt_ids)} tokens; max_prompt_tokens is "
                f"{self.max_prompt}: shorten it",
                param="prompt",
                code="context_length_exceeded",
            )
        try:
            self.engine.check_lengths(len(prompt_ids), params.max_tokens)
        except BadInputError as e:
            raise ApiError(400, str(e), param="max_tokens", code="context_length_exceeded") from e
        if not self.loop.alive:
            raise ApiError(503, "the engine has stopped; see the server log", "server_error")
        if self.outstanding + n > self.limit:
            raise ApiError(
                429,
                f"{self.outstanding} requests are running or waiting (the limit"
                f" is {self.limit}); retry later",
                "rate_limit_exceeded",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )


def build_app(settings: ApiSettings, engine: Engine) -> FastAPI:
    svc = Service(settings, engine)
    tracing = Tracing.build(settings.trace, "scalelab-generate")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc.loop.start()
        yield
        svc.loop.stop()
        if tracing is not None:
            tracing.shutdown()

    app = FastAPI(title="scalelab generate", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = svc
    app.state.tracing = tracing

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(
            error_doc(e.message, e.type, e.param, e.code), e.status, headers=e.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid body", "type": ""}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":
            msg = f"the body is not valid JSON: {first.get('msg')}"
        elif first.get("type") == "extra_forbidden":  # OpenAI's words for an unknown field
            msg = f"Unrecognized request argument supplied: {'.'.join(loc)}"
        else:
            msg = f"{'.'.join(loc) or 'body'}: {first.get('msg')}"
        return JSONResponse(error_doc(msg, "invalid_request_error", ".".join(loc) or None), 400)

    @app.exception_handler(FieldError)
    async def _field(request: Request, e: FieldError) -> JSONResponse:
        return JSONResponse(error_doc(e.message, "invalid_request_error", e.param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_doc(str(e.detail), "invalid_request_error"),
            e.status_code,
            headers=getattr(e, "headers", None),
        )

    @app.get("/health")
    async def health() -> Response:
        if not svc.loop.alive:
            return JSONResponse({"status": "engine stopped"}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [svc.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        svc.check_model(model_id)
        return svc.model_card()

    add_endpoints(app, svc)

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        m = engine.metrics
        body = generate_latest(m.registry) if m else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/debug/pool")
    async def pool() -> dict[str, Any]:
        """Block-pool state (what the fault tests assert returns to whole)."""
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
            "outstanding": svc.outstanding,
            "live": svc.loop.num_live,
            "running": engine.num_running,
            "waiting": engine.num_waiting,
            "prefix_hit_rate": b.stats.hit_rate,
            "preemptions": engine.scheduler.num_preemptions,
            "spec_acceptance": engine.stats.acceptance_rate,
        }

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        body.refuse_unsupported()
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise ApiError(400, "one prompt per request: send a string (or one request "
                               "per prompt)", param="prompt")
            p = p[0]
        if isinstance(p, str):
            ids = engine.tokenizer.encode(p)
        else:
            ids = [int(t) for t in p]
            if any(not 0 <= t < engine.tokenizer.vocab_size for t in ids):
                raise ApiError(
                    400,
                    f"prompt token ids must lie in [0, {engine.tokenizer.vocab_size})",
                    param="prompt",
                )
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        params = svc.params(body, body.max_tokens, settings.default_max_tokens)
        echo = (p if isinstance(p, str) else engine.tokenizer.decode(ids)) if body.echo else ""
        return await _serve(body, request, ids, params, chat=False, echo=echo)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        body.refuse_unsupported()
        ids = svc.chat_ids(body.template_messages(), body.add_generation_prompt,
                           body.chat_template_kwargs)
        n = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else (body.max_tokens)
        )
        default = min(settings.default_chat_max_tokens, settings.max_output_tokens)
        params = svc.params(body, n, default)
        return await _serve(body, request, ids, params, chat=True)

    async def _serve(
        body: CompletionRequest | ChatRequest,
        request: Request,
        ids: list[int],
        params: SamplingParams,
        chat: bool,
        echo: str = "",
    ) -> Response:
        """echo: text every choice starts with (completions' `echo`: the prompt)."""
        g: spans.GenTrace | None = None
        if tracing is not None:
            g = spans.begin(tracing, request.scope, chat=chat, model=body.model, params=params,
                            stream=bool(body.stream), start=time.perf_counter())
        n = body.n
        try:
            svc.check(body.model, ids, params, n)
        except ApiError as e:
            if g is not None:
                g.rt.end(e.status)
            raise
        if g is not None:
            spans.admitted(g)
        timeout = min(body.timeout or settings.request_timeout_s, settings.request_timeout_s)
        handles: list[Handle] = []
        try:
            for i in range(n):
                # seeded choices differ from each other and repeat as a whole
                p = params if i == 0 or params.seed is None else replace(params,
                                                                         seed=params.seed + i)
                handles.append(svc.loop.submit(ids, p, timeout))
                svc.outstanding += 1
        except BaseException:
            for h in handles:
                _release(h)
            raise
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if g is not None:
            g.response_id, handles[0].trace = rid, g

        def release_all() -> None:
            for h in handles:
                _release(h)

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
                headers={"Cache-Control": "no-cache",
                         **({"traceparent": g.rt.traceparent()} if g is not None else {})},
            )
        resp = await _whole(handles, rid, chat, request, body.return_tokens_as_token_ids,
                            release_all, echo)
        if g is not None:
            resp.headers["traceparent"] = g.rt.traceparent()
        return resp

    def _release(h: Handle) -> None:
        if h.released:
            return
        h.released = True
        svc.loop.abort(h)  # no-op when it already finished
        svc.outstanding -= 1
        if h.trace is not None:
            spans.finish(h.trace, h.seq, model=engine.name)

    async def _whole(handles: list[Handle], rid: str, chat: bool, request: Request,
                     as_ids: bool, release_all: Callable[[], None], echo: str) -> Response:
        texts: list[list[str]] = [[] for _ in handles]
        lps: list[list[TokenLogprob]] = [[] for _ in handles]

        async def collect(i: int, h: Handle) -> Event:
            while True:
                ev = await h.events.get()
                texts[i].append(ev.text)
                lps[i].extend(ev.logprobs)
                if ev.finished:
                    return ev

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work: asyncio.Future[list[Event]] = asyncio.ensure_future(
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
        evs: list[Event] = work.result()
        for ev in evs:
            if ev.finish_reason == "timeout":
                raise ApiError(
                    504,
                    f"the request's deadline passed after {ev.completion_tokens} tokens",
                    "timeout",
                )
            if ev.finish_reason == "error":
                raise ApiError(503, "the engine stopped while generating", "server_error")
        # the prompt is counted once however many choices share it (OpenAI's usage)
        use = usage(evs[0].prompt_tokens, sum(ev.completion_tokens for ev in evs),
                    max(ev.cached_tokens for ev in evs))
        report_usage(request.scope, "tokens", use["total_tokens"])
        tok = engine.tokenizer
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
        doc = (chat_doc if chat else completion_doc)(rid, engine.name, choices, use)
        return JSONResponse(doc)

    return app


def engine_from_settings(settings: ApiSettings) -> Engine:
    import torch

    from scalelab.generate.models import load_model

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    cfg = EngineConfig(**settings.engine)
    loaded = load_model(settings.model, cfg.max_model_len, seed=settings.seed, weights=cfg.weights)
    return Engine(
        loaded.model, loaded.tokenizer, cfg, name=loaded.name,
        metrics=EngineMetrics(loaded.name, max_model_len=cfg.max_model_len)
    )


def wrap(app: FastAPI, settings: ApiSettings) -> ASGIApp:
    """Body limit and request ids around the app (errors in OpenAI's shape), governance
    outside both when configured (the one model this server serves is every request's), and
    the API key ($SCALELAB_API_KEY, set by --api-key) outside everything."""
    name = app.state.service.engine.name

    def route(scope: Scope) -> str | None:
        return name if scope["method"] == "POST" and scope["path"] in WORK_ROUTES else None

    inner = governed(Guard(app, max_body=settings.max_body_bytes, error_body=_error_body,
                           access=AccessLog("scalelab.generate.access")),
                     settings.governance_file, route=route,
                     admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None, error_body=_error_body)
    key = os.environ.get(API_KEY_ENV)
    # Outermost: a request without the key costs no body read and no governance budget.
    return ApiKeyGuard(inner, key) if key else inner


def create_app() -> ASGIApp:
    """uvicorn factory: the app for the settings in $SCALELAB_GENERATE_SETTINGS."""
    raw = os.environ.get(SETTINGS_ENV)
    settings = ApiSettings.from_json(raw) if raw else ApiSettings()
    return wrap(build_app(settings, engine_from_settings(settings)), settings)
