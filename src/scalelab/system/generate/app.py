"""The OpenAI-compatible HTTP API over the engine: /v1/completions, /v1/chat/completions (both
streaming as Server-Sent Events), /v1/models, /health, /metrics, and vLLM's /tokenize,
/detokenize and /version. With an API key, /v1/* needs it as a Bearer token (generate.auth).

This module is the thin part: the URLs, OpenAI's error bodies, and the layers around the app
(web.hook); the handlers are methods of `generate.service.GenerationService`.

Admission: at most max_num_seqs running plus max_waiting waiting requests are held; the next
one gets 429 with Retry-After at once instead of an unbounded queue. Every request carries a
deadline; a prompt over max_prompt_tokens or a max_tokens over max_output_tokens is a 400 that
names the limit. A client that goes away (mid-stream or while waiting for a whole answer) is
aborted in the engine, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import json
import os

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Scope

from scalelab.layers.web.access import AccessLog
from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.hook import admitted
from scalelab.system.generate.auth import API_KEY_ENV, ApiKeyGuard
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.metrics import EngineMetrics
from scalelab.system.generate.protocol import FieldError, error_doc
from scalelab.system.generate.service import GenerationService
from scalelab.system.generate.settings import SETTINGS_ENV, ApiSettings

__all__ = [
    "SETTINGS_ENV",
    "ApiSettings",
    "GenerationService",
    "HttpError",
    "app_from_env",
    "build_app",
    "create_app",
    "engine_from_settings",
    "wrap",
]

ADMIN_TOKEN_ENV = "SCALELAB_ADMIN_TOKEN"
WORK_ROUTES = ("/v1/completions", "/v1/chat/completions")

_ERROR_TYPES = {401: "authentication_error", 403: "permission_error",
                429: "rate_limit_exceeded", 503: "server_error"}
"""OpenAI's error type for the statuses the guard and governance answer (else a bad request)."""


def _error_body(status: int, message: str) -> bytes:
    return json.dumps(error_doc(message, _ERROR_TYPES.get(status, "invalid_request_error"))
                      ).encode()


async def _api_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, HttpError)
    return JSONResponse(error_doc(e.message, e.type, e.param, e.code), e.status,
                        headers=e.headers)


async def _invalid(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
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


async def _field(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, FieldError)
    return JSONResponse(error_doc(e.message, "invalid_request_error", e.param), 400)


async def _http(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, StarletteHTTPException)
    return JSONResponse(error_doc(str(e.detail), "invalid_request_error"), e.status_code,
                        headers=getattr(e, "headers", None))


def build_app(settings: ApiSettings, engine: LlmEngine) -> FastAPI:
    """The FastAPI app: the service's handler methods on their URLs, errors in OpenAI's shape
    (`app.state.service` is the service, `app.state.tracing` its tracer or None)."""
    svc = GenerationService(settings, engine)
    app = FastAPI(title="scalelab generate", lifespan=svc.lifespan, docs_url=None,
                  redoc_url=None)
    app.state.service = svc
    app.state.tracing = svc.hook.tracing
    app.add_exception_handler(HttpError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(FieldError, _field)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.get("/health")(svc.health)
    app.get("/v1/models")(svc.models)
    app.get("/v1/models/{model_id:path}")(svc.model)
    app.post("/tokenize")(svc.tokenize)
    app.post("/detokenize")(svc.detokenize)
    app.get("/version")(svc.version)
    app.get("/metrics")(svc.metrics)
    app.get("/v1/debug/pool")(svc.pool)
    app.post("/v1/completions")(svc.completions)
    app.post("/v1/chat/completions")(svc.chat)
    return app


def engine_from_settings(settings: ApiSettings) -> LlmEngine:
    import torch

    from scalelab.system.generate.models import load_model

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    cfg = LlmEngineConfig(**settings.engine)
    loaded = load_model(settings.model, cfg.max_model_len, seed=settings.seed, weights=cfg.weights)
    return LlmEngine(
        loaded.model, loaded.tokenizer, cfg, name=loaded.name,
        metrics=EngineMetrics(loaded.name, max_model_len=cfg.max_model_len)
    )


def wrap(app: FastAPI, settings: ApiSettings) -> ASGIApp:
    """Body limit and request ids around the app (errors in OpenAI's shape), governance
    outside both when configured (the one model this server serves is every request's), and
    the API key ($SCALELAB_API_KEY, set by --api-key) outside everything."""
    name = app.state.service.engine.name

    def work(scope: Scope) -> str | None:
        return name if scope["method"] == "POST" and scope["path"] in WORK_ROUTES else None

    inner = admitted(app, max_body=settings.max_body_bytes,
                     access=AccessLog("scalelab.system.generate.access"),
                     governance=settings.governance_file, work=work,
                     admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None, error_body=_error_body)
    key = os.environ.get(API_KEY_ENV)
    # Outermost: a request without the key costs no body read and no governance budget.
    return ApiKeyGuard(inner, key) if key else inner


def create_app(settings: ApiSettings) -> ASGIApp:
    """The whole server for `settings`: the engine loaded, the app and its layers around it."""
    return wrap(build_app(settings, engine_from_settings(settings)), settings)


def app_from_env() -> ASGIApp:
    """uvicorn factory: the app for the settings in $SCALELAB_GENERATE_SETTINGS (the defaults
    when it is unset)."""
    raw = os.environ.get(SETTINGS_ENV)
    return create_app(ApiSettings.from_json(raw) if raw else ApiSettings())
