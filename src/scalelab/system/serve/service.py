"""The tabular server as an object: `TabularService` holds the context (settings, repository,
metrics, tracing) and the bare infer handler, and has one method per FastAPI route — health,
server and model metadata, readiness, statistics, routing state, /metrics and Triton's
repository extension. `serve.app` registers the methods (URLs there) and owns the lifespan.

These routes answer rarely and are documented in /openapi.json, so FastAPI's conveniences cost
nothing that matters; the inference route's hot path is the bare ASGI handler (`serve.infer`),
which the infer methods here only hand the exchange to (should a request ever reach FastAPI).
Each method is called directly in a test, without a socket. Method names are the operation
ids FastAPI derives for /openapi.json: keep them.
"""

from __future__ import annotations

import gc
from dataclasses import asdict
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from scalelab import __version__
from scalelab.layers.web.errors import HttpError
from scalelab.system.serve.admin import check_admin
from scalelab.system.serve.context import ServeContext
from scalelab.system.serve.health import EXTENSIONS, model_stats
from scalelab.system.serve.infer import InferHandler


class _Delegate(Response):
    """A FastAPI return value that hands the raw ASGI exchange to the infer handler."""

    def __init__(self, handler: InferHandler, name: str, version: str | None) -> None:
        super().__init__()
        self.handler, self.name, self.version = handler, name, version

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send, self.name, self.version)


class TabularService:
    """The context and the infer handler, with a handler method per FastAPI route."""

    def __init__(self, ctx: ServeContext, infer: InferHandler) -> None:
        self.ctx = ctx
        self.repo = ctx.repo
        self.infer = infer

    # -- health, metadata, statistics, routing, metrics (no docstrings: FastAPI would
    # publish them in /openapi.json) -------------------------------------------------------

    async def live(self) -> dict[str, bool]:  # GET /v2/health/live
        return {"live": True}

    async def ready(self) -> JSONResponse:  # GET /v2/health/ready
        ok = self.ctx.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def server_metadata(self) -> dict[str, Any]:  # GET /v2
        return {"name": "scalelab", "version": __version__, "extensions": EXTENSIONS}

    async def all_stats(self) -> dict[str, Any]:  # GET /v2/models/stats
        return model_stats(self.repo, None, None)

    async def one_model_stats(self, name: str) -> dict[str, Any]:
        return model_stats(self.repo, name, None)

    async def version_stats(self, name: str, version: str) -> dict[str, Any]:
        return model_stats(self.repo, name, version)

    def metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """A model's (or one version's) metadata document; 503 when it failed to load."""
        repo = self.repo
        entry = repo.entry(name)
        if entry.config is None:
            raise HttpError(503, f"model '{name}' failed to load: {entry.reason}")
        vs = [str(repo.version_state(name, version).version)] if version is not None \
            else [str(v) for v in sorted(entry.versions)]
        cfg = entry.config
        return {"name": name, "versions": vs, "platform": cfg.platform,
                "inputs": [t.model_dump() for t in cfg.inputs],
                "outputs": [t.model_dump() for t in cfg.outputs]}

    async def model_metadata(self, name: str) -> dict[str, Any]:
        return self.metadata(name, None)

    async def version_metadata(self, name: str, version: str) -> dict[str, Any]:
        return self.metadata(name, version)

    def readiness(self, name: str, version: str | None) -> JSONResponse:
        """200 when the model (version) is READY, 503 when it is not yet or no longer; a
        name or version the repository does not know stays its 400/404."""
        try:
            s = self.repo.version_state(name, version)
            ok = s.state == "READY"
        except HttpError as e:
            if e.status in (400, 404):
                raise
            ok = False
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    async def model_ready(self, name: str) -> JSONResponse:
        return self.readiness(name, None)

    async def version_ready(self, name: str, version: str) -> JSONResponse:
        return self.readiness(name, version)

    async def routing(self, name: str) -> dict[str, Any]:  # GET /v2/models/{name}/routing
        entry = self.repo.entry(name)
        n, d = entry.shadow_compared, entry.shadow_disagreed
        return {"name": name, "routing": asdict(entry.routing), "ready_versions": entry.ready(),
                "shadow": {"compared": n, "disagreed": d,
                           "disagreement_rate": (d / n) if n else None}}

    async def prometheus(self) -> Response:  # GET /metrics
        return Response(self.ctx.metrics.expose(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- inference (documented here, served by the bare handler) --------------------------

    async def infer_route(self, name: str) -> Response:
        return _Delegate(self.infer, name, None)

    async def infer_version_route(self, name: str, version: str) -> Response:
        return _Delegate(self.infer, name, version)

    # -- Triton's repository extension (admin token) ----------------------------------

    def admin(self, request: Request) -> None:
        """Raise the 401/403 unless the request carries the admin token."""
        check_admin(self.ctx.token, request.headers.get("authorization", ""))

    async def repo_index(self, request: Request) -> JSONResponse:
        self.admin(request)
        return JSONResponse(self.repo.index())

    async def repo_load(self, request: Request, name: str) -> JSONResponse:
        self.admin(request)
        entry = await self.repo.load(name)
        gc.freeze()  # the new version's objects live as long as it does (see app.freeze_heap)
        if not entry.ready():
            bad = "; ".join(f"version {v}: {s.reason}" for v, s in entry.versions.items())
            raise HttpError(400, f"model '{name}' failed to load: {entry.reason or bad}")
        return JSONResponse({"name": name, "ready_versions": entry.ready()})

    async def repo_unload(self, request: Request, name: str) -> JSONResponse:
        self.admin(request)
        await self.repo.unload(name)
        return JSONResponse({"name": name, "unloaded": True})
