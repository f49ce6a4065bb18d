"""The ASGI app: Open Inference Protocol v2, the repository extension and /metrics.

`create_app(settings)` builds a dispatcher: `POST .../infer` goes straight to the bare ASGI
inference handler (`serve.infer`), everything else to the guard (`web.guard`) around a FastAPI
app made of routers by concern (`serve.health`: health, metadata, routing, metrics;
`serve.admin`: the repository extension), which also owns the lifespan and serves
/openapi.json — where the infer routes are documented (and routed to the same handler, should
a request ever reach FastAPI). Every request, either way, gets the guard's body limit (413) and
a request id (accepted from X-Request-Id or generated, echoed in the response and logged): the
infer handler applies the same checks itself (`web.guard.admit`).
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from scalelab import __version__
from scalelab.core.machine import available_cores
from scalelab.serve.admin import admin_router
from scalelab.serve.config import ServerSettings
from scalelab.serve.context import ADMIN_TOKEN_ENV, ServeContext
from scalelab.serve.health import health_router
from scalelab.serve.infer import InferHandler, infer_target
from scalelab.serve.protocol import InferenceRequest, ServeError
from scalelab.web.governance import governed
from scalelab.web.guard import Guard

__all__ = ["ADMIN_TOKEN_ENV", "ServeApp", "create_app"]


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with every local `#/$defs/X` reference replaced by its definition (pydantic
    puts shared models under $defs, which an OpenAPI operation cannot point into)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline_refs(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


def _infer_openapi() -> dict[str, Any]:
    """The infer routes read the raw body (JSON or JSON + binary tensors), so FastAPI cannot see
    its schema; this documents the JSON form in /openapi.json for clients and API fuzzers."""
    raw = InferenceRequest.model_json_schema()
    body = _inline_refs(raw, raw.get("$defs", {}))
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": body}}}}


def freeze_heap() -> None:
    """Move everything alive now (torch, numpy, FastAPI, the loaded models: ~200,000 objects)
    out of the collector's reach. A full collection walks every tracked object: one took 370 ms
    on this 2-core machine while it was busy (load 18), 0.007 ms after the freeze; under load
    it fires every few thousand requests and lands as a p99 spike. Objects that never die
    need not be walked; the cost is that garbage cycles among them (none are expected) are
    never collected."""
    gc.collect()
    gc.freeze()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class _Delegate(Response):
    """A FastAPI return value that hands the raw ASGI exchange to the infer handler."""

    def __init__(self, handler: InferHandler, name: str, version: str | None) -> None:
        super().__init__()
        self.handler, self.name, self.version = handler, name, version

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send, self.name, self.version)


def _api(ctx: ServeContext, infer: InferHandler) -> FastAPI:
    settings = ctx.settings
    repo = ctx.repo

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        threads = settings.torch_threads or max(1, available_cores() // settings.workers)
        torch.set_num_threads(threads)
        sys.setswitchinterval(settings.gil_switch_ms / 1000.0)
        await repo.load_all()
        grpc_server = None
        if settings.grpc_port is not None:  # on this loop: it shares the batchers' queues
            from scalelab.serve.grpc_service import make_server

            grpc_server = make_server(ctx, infer, settings.host, settings.grpc_port)
            await grpc_server.start()
        freeze_heap()
        watched = ctx.metrics.watch_gc()
        watcher = asyncio.create_task(repo.watch())
        ctx.started = True
        yield
        gc.callbacks.remove(watched)
        ctx.draining = True
        if grpc_server is not None:  # in-flight calls finish (bounded), new ones are refused
            await grpc_server.stop(settings.graceful_s)
        watcher.cancel()
        await asyncio.gather(*ctx.background, return_exceptions=True)
        await repo.close()
        if ctx.tracing is not None:
            ctx.tracing.shutdown()  # export the spans still queued

    api = FastAPI(title="scalelab serve", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    api.state.ctx = ctx

    @api.exception_handler(ServeError)
    async def _serve_error(_: Request, e: ServeError) -> JSONResponse:
        return _error(e.status, e.message, e.headers)

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail))

    @api.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        return _error(422, f"field '{loc}': {err.get('msg')}")

    api.include_router(health_router(ctx))
    doc = _infer_openapi()

    @api.post("/v2/models/{name}/infer", openapi_extra=doc)
    async def infer_route(name: str) -> Response:
        return _Delegate(infer, name, None)

    @api.post("/v2/models/{name}/versions/{version}/infer", openapi_extra=doc)
    async def infer_version_route(name: str, version: str) -> Response:
        return _Delegate(infer, name, version)

    api.include_router(admin_router(ctx))
    return api


class ServeApp:
    """Dispatch: infer POSTs to the bare handler, the rest (and the lifespan) to FastAPI."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx
        self.infer = InferHandler(ctx)
        self.api = _api(ctx, self.infer)
        self.rest = Guard(self.api, max_body=ctx.settings.max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            target = infer_target(scope["path"])
            if target is not None:
                await self.infer(scope, receive, send, target[0], target[1])
                return
        await self.rest(scope, receive, send)


def create_app(settings: ServerSettings) -> ASGIApp:
    """The whole server for `settings`."""
    ctx = ServeContext.build(settings)
    return governed(ServeApp(ctx), settings.governance_file, route=governed_model,
                    admin_token=ctx.token)


def governed_model(scope: Scope) -> str | None:
    """The model an infer POST works for (governance applies to those, not to health,
    metrics or admin routes)."""
    if scope["method"] != "POST":
        return None
    target = infer_target(scope["path"])
    return None if target is None else target[0]
