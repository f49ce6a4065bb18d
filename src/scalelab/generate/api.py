"""The OpenAI-compatible HTTP API over the engine: /v1/completions, /v1/chat/completions (both
streaming as Server-Sent Events), /v1/models, /health, /metrics.

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
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from scalelab.core.errors import BadInputError, BadUsageError
from scalelab.generate import spans
from scalelab.generate.engine import Engine, EngineConfig
from scalelab.generate.loop import EngineLoop, Event, Handle
from scalelab.generate.metrics import EngineMetrics
from scalelab.generate.protocol import (
    ChatRequest,
    CompletionRequest,
    chat_doc,
    chunk_doc,
    completion_doc,
    error_doc,
    usage,
)
from scalelab.generate.sequence import SamplingParams
from scalelab.web.governance import governed, report_usage
from scalelab.web.guard import Guard
from scalelab.web.trace import TraceConfig, Tracing

SETTINGS_ENV = "SCALELAB_GENERATE_SETTINGS"
ADMIN_TOKEN_ENV = "SCALELAB_ADMIN_TOKEN"
WORK_ROUTES = ("/v1/completions", "/v1/chat/completions")


@dataclass(kw_only=True)
class ApiSettings:
    """Everything `scalelab generate serve` configures (travels to uvicorn as JSON)."""

    model: str = "smollm2-135m"
    """smollm2-135m, tiny, or a Llama .gguf path."""
    engine: dict[str, Any] = field(default_factory=dict)
    """EngineConfig fields (kv_cache_bytes, block_size, max_num_seqs, ...)."""
    max_waiting: int = 64
    """Requests held beyond the running batch; the next one gets 429."""
    max_prompt_tokens: int | None = None
    """Longest prompt accepted (default: max_model_len - 1)."""
    max_output_tokens: int = 1024
    """Largest max_tokens accepted."""
    default_max_tokens: int = 16
    """max_tokens when a completion request gives none (OpenAI's default)."""
    default_chat_max_tokens: int = 256
    """max_tokens when a chat request gives none."""
    request_timeout_s: float = 120.0
    """Deadline from arrival; then the request is dropped (504, or an error event mid-stream)."""
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1
    torch_threads: int | None = None
    seed: int = 0
    """Seed of the tiny model's weights."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """Request tracing (web.trace): admission, queue, prefill, decode spans per request."""
    governance_file: str | None = None
    """Rate limits, budgets (tokens reported per request) and kill switches (web.governance);
    None = no governance layer."""

    def __post_init__(self) -> None:
        if self.max_waiting < 0 or self.max_output_tokens < 1 or self.request_timeout_s <= 0:
            raise BadUsageError("max_waiting >= 0, max_output_tokens >= 1, timeout > 0 needed")
        self.trace = TraceConfig.of(self.trace)  # a dict when it came through JSON
        EngineConfig(**self.engine)  # fail here, in the CLI, not in the server process

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ApiSettings:
        return cls(**json.loads(text))


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


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


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
            )
        except BadInputError as e:
            raise ApiError(400, str(e), param="stop") from e

    def check(self, model: str, prompt_ids: list[int], params: SamplingParams) -> None:
        if model != self.engine.name:
            raise ApiError(
                404,
                f"model {model!r} does not exist; this server serves "
                f"{self.engine.name!r} (see GET /v1/models)",
                param="model",
                code="model_not_found",
            )
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
        if self.outstanding >= self.limit:
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
        else:
            msg = f"{'.'.join(loc) or 'body'}: {first.get('msg')}"
        return JSONResponse(error_doc(msg, "invalid_request_error", ".".join(loc) or None), 400)

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
        return {
            "object": "list",
            "data": [
                {
                    "id": engine.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "scalelab",
                    "max_model_len": engine.cfg.max_model_len,
                }
            ],
        }

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
        return {
            "num_blocks": b.num_blocks,
            "free": b.num_free,
            "used": b.num_used,
            "whole": b.num_free == b.num_blocks,
            "outstanding": svc.outstanding,
            "running": engine.num_running,
            "waiting": engine.num_waiting,
            "prefix_hit_rate": b.stats.hit_rate,
            "preemptions": engine.scheduler.num_preemptions,
            "spec_acceptance": engine.stats.acceptance_rate,
        }

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if body.echo:
            raise ApiError(400, "echo is not supported; send echo=false", param="echo")
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise ApiError(400, "one prompt per request (n=1): send a string", param="prompt")
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
        return await _serve(body, request, ids, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        text = engine.tokenizer.render_chat([m.model_dump() for m in body.messages])
        ids = engine.tokenizer.encode(text)
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
    ) -> Response:
        g: spans.GenTrace | None = None
        if tracing is not None:
            g = spans.begin(tracing, request.scope, chat=chat, model=body.model, params=params,
                            stream=bool(body.stream), start=time.perf_counter())
        try:
            svc.check(body.model, ids, params)
        except ApiError as e:
            if g is not None:
                g.rt.end(e.status)
            raise
        if g is not None:
            spans.admitted(g)
        svc.outstanding += 1
        try:
            timeout = min(body.timeout or settings.request_timeout_s, settings.request_timeout_s)
            h = svc.loop.submit(ids, params, timeout)
        except BaseException:
            svc.outstanding -= 1
            raise
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if g is not None:
            g.response_id, h.trace = rid, g
        if body.stream:
            include = bool(body.stream_options and body.stream_options.include_usage)
            return _Stream(
                _stream(h, rid, chat, include, request.scope),
                on_close=lambda: _release(h),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache",
                         **({"traceparent": g.rt.traceparent()} if g is not None else {})},
            )
        resp = await _whole(h, rid, chat, request)
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

    async def _whole(h: Handle, rid: str, chat: bool, request: Request) -> Response:
        texts: list[str] = []

        async def collect() -> Event:
            while True:
                ev = await h.events.get()
                texts.append(ev.text)
                if ev.finished:
                    return ev

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work = asyncio.ensure_future(collect())
        watch = asyncio.ensure_future(gone())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
            _release(h)
        if not work.done() or work.cancelled():
            return Response(status_code=499)  # nobody is listening any more
        ev = work.result()
        if ev.finish_reason == "timeout":
            raise ApiError(
                504,
                f"the request's deadline passed after {ev.completion_tokens} tokens",
                "timeout",
            )
        if ev.finish_reason == "error":
            raise ApiError(503, "the engine stopped while generating", "server_error")
        use = usage(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
        report_usage(request.scope, "tokens", use["total_tokens"])
        doc = (chat_doc if chat else completion_doc)(
            rid, engine.name, "".join(texts), ev.finish_reason, use
        )
        return JSONResponse(doc)

    async def _stream(h: Handle, rid: str, chat: bool, include_usage: bool, scope: Scope
                      ) -> AsyncIterator[bytes]:
        created = int(time.time())
        first = True
        try:
            if chat:
                yield _sse(chunk_doc(True, rid, engine.name, created, "", None, True))
                first = False
            while True:
                ev = await h.events.get()
                if ev.finish_reason in ("timeout", "error"):
                    kind = "timeout" if ev.finish_reason == "timeout" else "server_error"
                    yield _sse(
                        error_doc(
                            f"generation ended early ({ev.finish_reason}) after "
                            f"{ev.completion_tokens} tokens",
                            kind,
                        )
                    )
                    break
                if ev.text:
                    yield _sse(chunk_doc(chat, rid, engine.name, created, ev.text, None, first))
                    first = False
                if ev.finished:
                    use = usage(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
                    report_usage(scope, "tokens", use["total_tokens"])
                    last = chunk_doc(
                        chat,
                        rid,
                        engine.name,
                        created,
                        None if chat else "",
                        ev.finish_reason,
                        first,
                    )
                    last["usage"] = use
                    yield _sse(last)
                    if include_usage:
                        yield _sse(
                            {
                                "id": rid,
                                "object": last["object"],
                                "created": created,
                                "model": engine.name,
                                "choices": [],
                                "usage": use,
                            }
                        )
                    break
            yield b"data: [DONE]\n\n"
        finally:
            _release(h)  # also when the client disconnected and the generator was closed

    return app


class _Stream(StreamingResponse):
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


def engine_from_settings(settings: ApiSettings) -> Engine:
    import torch

    from scalelab.generate.models import load_model

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    cfg = EngineConfig(**settings.engine)
    loaded = load_model(settings.model, cfg.max_model_len, seed=settings.seed, weights=cfg.weights)
    return Engine(
        loaded.model, loaded.tokenizer, cfg, name=loaded.name, metrics=EngineMetrics(loaded.name)
    )


def wrap(app: FastAPI, settings: ApiSettings) -> ASGIApp:
    """Body limit and request ids around the app (errors in OpenAI's shape), and governance
    outside both when configured (the one model this server serves is every request's)."""
    name = app.state.service.engine.name

    def route(scope: Scope) -> str | None:
        return name if scope["method"] == "POST" and scope["path"] in WORK_ROUTES else None

    return governed(Guard(app, max_body=settings.max_body_bytes, error_body=_error_body),
                    settings.governance_file, route=route,
                    admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None, error_body=_error_body)


def create_app() -> ASGIApp:
    """uvicorn factory: the app for the settings in $SCALELAB_GENERATE_SETTINGS."""
    raw = os.environ.get(SETTINGS_ENV)
    settings = ApiSettings.from_json(raw) if raw else ApiSettings()
    return wrap(build_app(settings, engine_from_settings(settings)), settings)
