"""The ASGI app: Open Inference Protocol v2 routes, repository admin routes, /metrics.

`create_app(settings)` wires the repository, metrics, sampler and routes together. The guard
middleware bounds request bodies (413) and gives every request an id (accepted from
X-Request-Id or generated) that is echoed in the response and logged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from scalelab import __version__
from scalelab.core.machine import available_cores
from scalelab.serve.cache import digest
from scalelab.serve.config import ServerSettings
from scalelab.serve.features import out_of_vocabulary
from scalelab.serve.metrics import Metrics
from scalelab.serve.protocol import (
    HEADER_LENGTH,
    InferenceRequest,
    ServeError,
    decode_inputs,
    encode_response,
    parse_request,
)
from scalelab.serve.repository import ModelEntry, ModelRepository
from scalelab.serve.sampling import RequestSampler, SamplingConfig
from scalelab.serve.scheduler import Job, Outputs, VersionWorker
from scalelab.web.access import AccessLog
from scalelab.web.guard import Guard

log = logging.getLogger("scalelab.serve")

TIMEOUT_HEADER = "x-request-timeout-ms"
ADMIN_TOKEN_ENV = "SCALELAB_ADMIN_TOKEN"


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


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _timeout_s(request: Request, default_ms: float) -> float:
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return default_ms / 1000.0
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not 0 < ms <= 3_600_000:
        raise ServeError(400, f"header X-Request-Timeout-Ms {raw!r} must be a number of "
                              "milliseconds in (0, 3600000]")
    return ms / 1000.0


def create_app(settings: ServerSettings) -> FastAPI:
    metrics = Metrics()
    access = AccessLog("scalelab.serve.access", settings.access_log,
                       per_second=settings.access_log_per_second)
    sampler = None
    if settings.sample_dir is not None:
        sub = settings.sample_dir / f"pid-{os.getpid()}" if settings.workers > 1 \
            else settings.sample_dir
        sampler = RequestSampler(SamplingConfig(directory=sub, rate=settings.sample_rate,
                                                max_rows=settings.sample_max_rows,
                                                max_files=settings.sample_max_files))
    repo = ModelRepository(settings.model_repo, metrics=metrics, sampler=sampler,
                           poll_s=settings.poll_s, drain_s=settings.graceful_s)
    token = settings.admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None
    state: dict[str, Any] = {"started": False, "draining": False}
    background: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        threads = settings.torch_threads or max(1, available_cores() // settings.workers)
        torch.set_num_threads(threads)
        sys.setswitchinterval(settings.gil_switch_ms / 1000.0)
        await repo.load_all()
        watcher = asyncio.create_task(repo.watch())
        state["started"] = True
        yield
        state["draining"] = True
        watcher.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await repo.close()

    app = FastAPI(title="scalelab serve", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.repo = repo
    app.state.metrics = metrics

    @app.exception_handler(ServeError)
    async def _serve_error(_: Request, e: ServeError) -> JSONResponse:
        return _error(e.status, e.message, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        return _error(422, f"field '{loc}': {err.get('msg')}")

    # -- health and metadata -------------------------------------------------------------------

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok = state["started"] and not state["draining"] and (
            not repo.models or any(e.ready() for e in repo.models.values()))
        return JSONResponse({"ready": bool(ok)}, status_code=200 if ok else 503)

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "scalelab", "version": __version__,
                "extensions": ["binary_tensor_data", "model_repository"]}

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

    @app.get("/v2/models/{name}")
    async def model_metadata(name: str) -> dict[str, Any]:
        return _metadata(name, None)

    @app.get("/v2/models/{name}/versions/{version}")
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

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> JSONResponse:
        return _ready(name, None)

    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def version_ready(name: str, version: str) -> JSONResponse:
        return _ready(name, version)

    @app.get("/v2/models/{name}/routing")
    async def routing(name: str) -> dict[str, Any]:
        entry = repo.entry(name)
        n, d = entry.shadow_compared, entry.shadow_disagreed
        return {"name": name, "routing": asdict(entry.routing), "ready_versions": entry.ready(),
                "shadow": {"compared": n, "disagreed": d,
                           "disagreement_rate": (d / n) if n else None}}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.expose(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- inference -----------------------------------------------------------------------------

    async def _run(worker: VersionWorker, arrays: list[np.ndarray], rid: str, deadline: float,
                   *, log_sample: bool = True) -> Outputs:
        loop = asyncio.get_running_loop()
        job = Job(inputs=arrays, rows=arrays[0].shape[0], request_id=rid,
                  enqueued_at=time.monotonic(), deadline=deadline, future=loop.create_future(),
                  log_sample=log_sample)
        worker.submit(job)
        return await job.future

    async def _compute(entry: ModelEntry, worker: VersionWorker, arrays: list[np.ndarray],
                       rid: str, deadline: float) -> Outputs:
        assert entry.config is not None
        labels = (entry.name, str(worker.version))
        use_cache = entry.cache is not None
        coalesce = entry.config.cache.coalesce
        if not (use_cache or coalesce):
            return await _run(worker, arrays, rid, deadline)
        key = (entry.name, worker.version, digest(arrays))
        if entry.cache is not None:
            hit = entry.cache.get(key)
            if hit is not None:
                metrics.cache_hits.labels(*labels).inc()
                return hit
            metrics.cache_misses.labels(*labels).inc()
        if coalesce:
            fut = entry.coalescer.join(key)
            if fut is not None:
                metrics.coalesced.labels(*labels).inc()
                try:
                    return await asyncio.wait_for(asyncio.shield(fut),
                                                  max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    raise ServeError(504, "deadline passed waiting for an identical in-flight "
                                          "request") from None
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if not fut.cancelled() or (task is not None and task.cancelling()):
                        raise
                    # the leader's client went away; compute this one ourselves
            lead = entry.coalescer.lead(key)
            try:
                out = await _run(worker, arrays, rid, deadline)
                lead.set_result(out)
            except Exception as e:
                lead.set_exception(e)
                raise
            finally:
                entry.coalescer.finish(key, lead)
        else:
            out = await _run(worker, arrays, rid, deadline)
        if entry.cache is not None:
            entry.cache.put(key, out)
        return out

    async def _shadow(entry: ModelEntry, worker: VersionWorker, arrays: list[np.ndarray],
                      rid: str, primary: Outputs) -> None:
        assert entry.config is not None
        deadline = time.monotonic() + entry.config.dynamic_batching.default_timeout_ms / 1000
        try:
            other = await _run(worker, arrays, rid, deadline, log_sample=False)
        except Exception:
            return  # the candidate failing or being full never touches the response
        a, b = _labels_of(primary), _labels_of(other)
        if a is None or b is None:
            return
        diff = int((a != b).sum())
        entry.shadow_compared += len(a)
        entry.shadow_disagreed += diff
        mv = (entry.name, str(worker.version))
        metrics.shadow_compared.labels(*mv).inc(len(a))
        metrics.shadow_disagreed.labels(*mv).inc(diff)

    async def _infer(request: Request, name: str, version: str | None) -> Response:
        t0 = time.monotonic()
        rid: str = request.scope["state"]["request_id"]
        status, served = 500, ""
        metrics.inflight.labels(name).inc()
        try:
            entry = repo.entry(name)
            if entry.config is None:
                raise ServeError(503, f"model '{name}' failed to load: {entry.reason}")
            body = await request.body()
            req, tail = parse_request(body, request.headers.get(HEADER_LENGTH))
            arrays = decode_inputs(req, entry.config, tail)
            deadline = t0 + _timeout_s(request, entry.config.dynamic_batching.default_timeout_ms)
            worker = repo.route(name, version, rid)
            _check_vocabulary(entry, worker, arrays)
            served = str(worker.version)
            outputs = await _compute(entry, worker, arrays, rid, deadline)
            shadow = repo.shadow_worker(name) if version is None else None
            if shadow is not None and shadow is not worker:
                task = asyncio.create_task(_shadow(entry, shadow, arrays, rid, outputs))
                background.add(task)
                task.add_done_callback(background.discard)
            payload, headers = encode_response(model=name, version=worker.version,
                                               request_id=req.id, outputs=outputs,
                                               cfg=entry.config, req=req)
            status = 200
            return Response(payload, status_code=200, headers=headers)
        except ServeError as e:
            status = e.status
            raise
        finally:
            metrics.inflight.labels(name).dec()
            dt = time.monotonic() - t0
            if served:
                metrics.request_seconds.labels(name, served).observe(dt)
            metrics.responses.labels(name, served, str(status)).inc()
            access.log(status, "infer", request_id=rid, model=name, version=served,
                       latency_ms=round(dt * 1000, 3))

    infer_doc = _infer_openapi()

    @app.post("/v2/models/{name}/infer", openapi_extra=infer_doc)
    async def infer(request: Request, name: str) -> Response:
        return await _infer(request, name, None)

    @app.post("/v2/models/{name}/versions/{version}/infer", openapi_extra=infer_doc)
    async def infer_version(request: Request, name: str, version: str) -> Response:
        return await _infer(request, name, version)

    # -- repository extension (admin) ----------------------------------------------------------

    def _admin(request: Request) -> None:
        if token is None:
            raise ServeError(403, "admin endpoints are disabled; start the server with "
                                  f"--admin-token or {ADMIN_TOKEN_ENV}")
        auth = request.headers.get("authorization", "")
        if not auth:
            raise ServeError(401, "admin endpoint: send 'Authorization: Bearer <token>'",
                             {"WWW-Authenticate": "Bearer"})
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                  token.encode()):
            raise ServeError(403, "admin endpoint: the bearer token is not valid")

    @app.api_route("/v2/repository/index", methods=["GET", "POST"])
    async def repo_index(request: Request) -> JSONResponse:
        _admin(request)
        return JSONResponse(repo.index())

    @app.post("/v2/repository/models/{name}/load")
    async def repo_load(request: Request, name: str) -> JSONResponse:
        _admin(request)
        entry = await repo.load(name)
        if not entry.ready():
            bad = "; ".join(f"version {v}: {s.reason}" for v, s in entry.versions.items())
            raise ServeError(400, f"model '{name}' failed to load: {entry.reason or bad}")
        return JSONResponse({"name": name, "ready_versions": entry.ready()})

    @app.post("/v2/repository/models/{name}/unload")
    async def repo_unload(request: Request, name: str) -> JSONResponse:
        _admin(request)
        await repo.unload(name)
        return JSONResponse({"name": name, "unloaded": True})

    app.add_middleware(Guard, max_body=settings.max_body_bytes)
    return app


def _check_vocabulary(entry: ModelEntry, worker: VersionWorker, arrays: list[np.ndarray]) -> None:
    """The flights contract's `categorical` input holds vocabulary indices; one out of range
    is the client's error (400 naming the input), not the model's (500)."""
    if worker.pre is None or entry.config is None:
        return
    for spec, arr in zip(entry.config.inputs, arrays, strict=True):
        if spec.name == "categorical" and arr.dtype.kind in "iu":
            why = out_of_vocabulary(arr, worker.pre)
            if why is not None:
                raise ServeError(400, f"input 'categorical': {why}")


def _labels_of(out: Outputs) -> np.ndarray | None:
    if "label" in out:
        return np.asarray(out["label"]).reshape(-1)
    for k in ("probabilities", "logits"):
        if k in out:
            return np.asarray(out[k]).argmax(axis=1)
    return None


