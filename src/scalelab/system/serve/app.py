"""The ASGI app: Open Inference Protocol v2, the repository extension and /metrics.

`create_app(settings)` builds a dispatcher: `POST .../infer` goes straight to the bare ASGI
inference handler (`serve.infer`), everything else to the guard (`web.guard`) around a FastAPI
app whose routes are the handler methods of `serve.service.TabularService` (health, metadata,
routing, metrics; the repository extension), which also owns the lifespan and serves
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
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from scalelab import __version__
from scalelab.lab.core.machine import available_cores
from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.governance.middleware import governed
from scalelab.layers.web.guard import Guard
from scalelab.system.serve.context import ADMIN_TOKEN_ENV, ServeContext
from scalelab.system.serve.infer import InferHandler, infer_target
from scalelab.system.serve.protocol import InferenceRequest
from scalelab.system.serve.service import TabularService
from scalelab.system.serve.settings import ServerSettings

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


def _api(svc: TabularService) -> FastAPI:
    ctx = svc.ctx
    infer = svc.infer
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
            from scalelab.system.serve.grpc_service import make_server

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

    @api.exception_handler(HttpError)
    async def _serve_error(_: Request, e: HttpError) -> JSONResponse:
        return _error(e.status, e.message, e.headers)

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail))

    @api.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        return _error(422, f"field '{loc}': {err.get('msg')}")

    api.include_router(_health_routes(svc))
    doc = _infer_openapi()
    api.post("/v2/models/{name}/infer", openapi_extra=doc)(svc.infer_route)
    api.post("/v2/models/{name}/versions/{version}/infer", openapi_extra=doc)(
        svc.infer_version_route)
    api.include_router(_admin_routes(svc))
    return api


def _health_routes(svc: TabularService) -> APIRouter:
    r = APIRouter()
    r.get("/v2/health/live")(svc.live)
    r.get("/v2/health/ready")(svc.ready)
    r.get("/v2")(svc.server_metadata)
    # before /v2/models/{name}: "stats" here is the extension, not a model's name
    r.get("/v2/models/stats")(svc.all_stats)
    r.get("/v2/models/{name}/stats")(svc.one_model_stats)
    r.get("/v2/models/{name}/versions/{version}/stats")(svc.version_stats)
    r.get("/v2/models/{name}")(svc.model_metadata)
    r.get("/v2/models/{name}/versions/{version}")(svc.version_metadata)
    r.get("/v2/models/{name}/ready")(svc.model_ready)
    r.get("/v2/models/{name}/versions/{version}/ready")(svc.version_ready)
    r.get("/v2/models/{name}/routing")(svc.routing)
    r.get("/metrics")(svc.prometheus)
    return r


def _admin_routes(svc: TabularService) -> APIRouter:
    r = APIRouter()
    r.api_route("/v2/repository/index", methods=["GET", "POST"])(svc.repo_index)
    r.post("/v2/repository/models/{name}/load")(svc.repo_load)
    r.post("/v2/repository/models/{name}/unload")(svc.repo_unload)
    return r


class ServeApp:
    """Dispatch: infer POSTs to the bare handler, the rest (and the lifespan) to FastAPI."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx
        self.infer = InferHandler(ctx)
        self.service = TabularService(ctx, self.infer)
        self.api = _api(self.service)
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
