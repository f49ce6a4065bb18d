"""Health, server and model metadata, readiness, routing state and /metrics (FastAPI router).

These answer rarely and are documented in /openapi.json, so FastAPI's conveniences cost
nothing that matters here; the inference route is elsewhere (`serve.infer`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from scalelab import __version__
from scalelab.serve.context import ServeContext
from scalelab.serve.protocol import ServeError
from scalelab.serve.repository import ModelRepository

EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics"]
"""The OIP/Triton extensions this server implements (server metadata lists them)."""


def model_stats(repo: ModelRepository, name: str | None, version: str | None
                ) -> dict[str, Any]:
    """The statistics extension's document: every loaded version of `name` (every model's
    when None), or just `version`; ServeError 404 for a model or version not loaded."""
    out = []
    for n in ([name] if name is not None else sorted(repo.models)):
        entry = repo.entry(n)
        states = [repo.version_state(n, version)] if version is not None else \
            [entry.versions[v] for v in sorted(entry.versions)]
        out += [s.worker.stats.doc(n, str(s.version)) for s in states if s.worker is not None]
    return {"model_stats": out}


def health_router(ctx: ServeContext) -> APIRouter:
    r = APIRouter()
    repo = ctx.repo

    @r.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @r.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok = ctx.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @r.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "scalelab", "version": __version__, "extensions": EXTENSIONS}

    # before /v2/models/{name}: "stats" here is the extension, not a model's name
    @r.get("/v2/models/stats")
    async def all_stats() -> dict[str, Any]:
        return model_stats(repo, None, None)

    @r.get("/v2/models/{name}/stats")
    async def one_model_stats(name: str) -> dict[str, Any]:
        return model_stats(repo, name, None)

    @r.get("/v2/models/{name}/versions/{version}/stats")
    async def version_stats(name: str, version: str) -> dict[str, Any]:
        return model_stats(repo, name, version)

    def _metadata(name: str, version: str | None) -> dict[str, Any]:
        entry = repo.entry(name)
        if entry.config is None:
            raise ServeError(503, f"model '{name}' failed to load: {entry.reason}")
        vs = [str(repo.version_state(name, version).version)] if version is not None \
            else [str(v) for v in sorted(entry.versions)]
        cfg = entry.config
        return {"name": name, "versions": vs, "platform": cfg.platform,
                "inputs": [t.model_dump() for t in cfg.inputs],
                "outputs": [t.model_dump() for t in cfg.outputs]}

    @r.get("/v2/models/{name}")
    async def model_metadata(name: str) -> dict[str, Any]:
        return _metadata(name, None)

    @r.get("/v2/models/{name}/versions/{version}")
    async def version_metadata(name: str, version: str) -> dict[str, Any]:
        return _metadata(name, version)

    def _ready(name: str, version: str | None) -> JSONResponse:
        try:
            s = repo.version_state(name, version)
            ok = s.state == "READY"
        except ServeError as e:
            if e.status in (400, 404):
                raise
            ok = False
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @r.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> JSONResponse:
        return _ready(name, None)

    @r.get("/v2/models/{name}/versions/{version}/ready")
    async def version_ready(name: str, version: str) -> JSONResponse:
        return _ready(name, version)

    @r.get("/v2/models/{name}/routing")
    async def routing(name: str) -> dict[str, Any]:
        entry = repo.entry(name)
        n, d = entry.shadow_compared, entry.shadow_disagreed
        return {"name": name, "routing": asdict(entry.routing), "ready_versions": entry.ready(),
                "shadow": {"compared": n, "disagreed": d,
                           "disagreement_rate": (d / n) if n else None}}

    @r.get("/metrics")
    async def prometheus() -> Response:
        return Response(ctx.metrics.expose(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    return r
