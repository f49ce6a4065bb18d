"""Triton's model repository extension: index, load, unload (FastAPI router), behind a bearer
token compared in constant time. No token configured = the endpoints answer 403."""

from __future__ import annotations

import gc
import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from scalelab.serve.context import ADMIN_TOKEN_ENV, ServeContext
from scalelab.serve.protocol import ServeError


def check_admin(token: str | None, authorization: str) -> None:
    """Raise the 401/403 for this Authorization header, or return when it carries `token`."""
    if token is None:
        raise ServeError(403, "admin endpoints are disabled; start the server with "
                              f"--admin-token or {ADMIN_TOKEN_ENV}")
    if not authorization:
        raise ServeError(401, "admin endpoint: send 'Authorization: Bearer <token>'",
                         {"WWW-Authenticate": "Bearer"})
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                              token.encode()):
        raise ServeError(403, "admin endpoint: the bearer token is not valid")


def admin_router(ctx: ServeContext) -> APIRouter:
    r = APIRouter()
    repo = ctx.repo

    def _admin(request: Request) -> None:
        check_admin(ctx.token, request.headers.get("authorization", ""))

    @r.api_route("/v2/repository/index", methods=["GET", "POST"])
    async def repo_index(request: Request) -> JSONResponse:
        _admin(request)
        return JSONResponse(repo.index())

    @r.post("/v2/repository/models/{name}/load")
    async def repo_load(request: Request, name: str) -> JSONResponse:
        _admin(request)
        entry = await repo.load(name)
        gc.freeze()  # the new version's objects live as long as it does (see app.freeze_heap)
        if not entry.ready():
            bad = "; ".join(f"version {v}: {s.reason}" for v, s in entry.versions.items())
            raise ServeError(400, f"model '{name}' failed to load: {entry.reason or bad}")
        return JSONResponse({"name": name, "ready_versions": entry.ready()})

    @r.post("/v2/repository/models/{name}/unload")
    async def repo_unload(request: Request, name: str) -> JSONResponse:
        _admin(request)
        await repo.unload(name)
        return JSONResponse({"name": name, "unloaded": True})

    return r
