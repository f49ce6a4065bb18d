"""The inference route as a bare ASGI handler: the per-request path does only what it must.

Per request: read the body, split off the binary tensors, parse JSON (orjson when installed),
check the tensors against the model's config (the fast hand check; the full pydantic path only
when that declines, so errors read the same), enqueue, await the batch, encode, send. Every
guarantee of the FastAPI version stays: the guard's body limit and request id (outside this
handler), 4xx naming the field, X-Request-Timeout-Ms deadlines, 429 + Retry-After from a full
queue, the cache and coalescing, shadow mirrors, the request sample (in the batch thread),
metrics and the access log. What is gone is the framework between the socket and this code:
routing by regex, dependency resolution, Request/Response objects and exception middleware
cost about half the main thread's time under a 1-row load (py-spy, issue 16).

Metric children are looked up once per label set and kept: prometheus-client's `.labels()`
takes a lock and builds a key on every call. The per-request metrics (in-flight gauge,
latency histogram, responses counter) are gathered over one event-loop turn and written once
at the start of the next (and before every /metrics exposition): a batch's requests finish in
the same turn, and in multiprocess mode each write is an mmap update under a lock (~4 us).
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
from prometheus_client import Counter, Gauge, Histogram
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.guard import REQUEST_ID_HEADER, BodyTooLarge, admit, send_error
from scalelab.layers.web.trace import RequestTrace, ns_mono
from scalelab.system.serve.cache import Key, input_key
from scalelab.system.serve.context import ServeContext
from scalelab.system.serve.features import out_of_vocabulary
from scalelab.system.serve.metrics import observe_many
from scalelab.system.serve.protocol import (
    JSON_HEADERS,
    decode_inputs,
    encode_outputs,
    fast_decode,
    parse_json,
    parse_json_fast,
    split_binary,
    validate_request,
    wanted,
)
from scalelab.system.serve.repository import ModelEntry
from scalelab.system.serve.runtimes import Outputs
from scalelab.system.serve.text import check_utf8
from scalelab.system.serve.worker import Job, VersionWorker

log = logging.getLogger("scalelab.system.serve")

TIMEOUT_HEADER = b"x-request-timeout-ms"
BINARY_HEADER = b"inference-header-content-length"
_PREFIX, _SUFFIX = "/v2/models/", "/infer"
_RID = REQUEST_ID_HEADER.encode()
_CT_JSON = (b"content-type", JSON_HEADERS["content-type"].encode())


def infer_target(path: str) -> tuple[str, str | None] | None:
    """(model, version or None) when `path` is an infer route, else None (pure)."""
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    parts = path[len(_PREFIX):-len(_SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


def timeout_s(raw: bytes | None, default_ms: float) -> float:
    """The request's deadline in seconds from X-Request-Timeout-Ms, else the model default."""
    if raw is None:
        return default_ms / 1000.0
    text = raw.decode("latin-1")
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 < ms <= 3_600_000:
        raise HttpError(400, f"header X-Request-Timeout-Ms {text!r} must be a number of "
                              "milliseconds in (0, 3600000]")
    return ms / 1000.0


async def read_body(receive: Receive, limit: int | None) -> bytes:
    """The whole body; with a `limit` (no usable Content-Length) BodyTooLarge past it."""
    msg = await receive()
    body: bytes = msg.get("body", b"")
    if limit is not None and len(body) > limit:
        raise BodyTooLarge(limit)
    if not msg.get("more_body", False):
        return body
    parts, seen = [body], len(body)
    while True:
        msg = await receive()
        chunk = msg.get("body", b"")
        seen += len(chunk)
        if limit is not None and seen > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)


def check_inputs(entry: ModelEntry, worker: VersionWorker, arrays: list[np.ndarray]) -> None:
    """What only the routed version can check: a text model's text is UTF-8, and flights'
    vocabulary indices are in range (400 naming the input, not the model's 500)."""
    if worker.text is not None and entry.config is not None:
        why = check_utf8(arrays[0], entry.config.inputs[0].name)
        if why is not None:
            raise HttpError(400, why)
    if worker.pre is not None:
        check_vocabulary(entry, worker, arrays)


def check_vocabulary(entry: ModelEntry, worker: VersionWorker, arrays: list[np.ndarray]) -> None:
    """The flights contract's `categorical` input holds vocabulary indices; one out of range
    is the client's error (400 naming the input), not the model's (500)."""
    if worker.pre is None or entry.config is None:
        return
    for spec, arr in zip(entry.config.inputs, arrays, strict=True):
        if spec.name == "categorical" and arr.dtype.kind in "iu":
            why = out_of_vocabulary(arr, worker.pre)
            if why is not None:
                raise HttpError(400, f"input 'categorical': {why}")


def trace_job(trace: RequestTrace, worker: VersionWorker, job: Job) -> None:
    """The queue, batch and compute spans of one traced job (what reached the batcher)."""
    if not job.picked_at:
        return
    trace.span("queue wait", ns_mono(job.enqueued_at), ns_mono(job.picked_at))
    b = job.batch
    if b is None:
        return
    attrs = {"scalelab.model": worker.model, "scalelab.model.version": worker.version,
             "scalelab.batch.id": b.batch_id, "scalelab.batch.size": b.rows,
             "scalelab.batch.requests": b.requests}
    trace.span("batch formation", ns_mono(job.picked_at), ns_mono(b.dispatched_at), attrs)
    # the two hand-offs around the forward (to the inference thread, and the event loop
    # waking this request once the batch's futures are set) are named: on a busy machine
    # they can outweigh the forward itself, and unnamed they would be the root's self time
    trace.span("thread hand-off", ns_mono(b.dispatched_at), ns_mono(b.compute_start))
    trace.span("model compute", ns_mono(b.compute_start), ns_mono(b.compute_end), attrs)
    trace.span("wake-up", ns_mono(b.compute_end), ns_mono(time.monotonic()))


def enqueue(worker: VersionWorker, arrays: list[np.ndarray], rid: str, deadline: float, *,
            log_sample: bool = True, traced: bool = False) -> Job:
    """Queue one request's tensors on `worker` (HttpError 429/503 when it cannot take
    them); the caller awaits `job.future`."""
    job = Job(inputs=arrays, rows=arrays[0].shape[0], request_id=rid,
              enqueued_at=time.monotonic(), deadline=deadline,
              future=asyncio.get_running_loop().create_future(), log_sample=log_sample,
              traced=traced)
    if traced:
        worker.traced = True
    worker.submit(job)
    return job


def labels_of(out: Outputs) -> np.ndarray | None:
    if "label" in out:
        return np.asarray(out["label"]).reshape(-1)
    for k in ("probabilities", "logits"):
        if k in out:
            return np.asarray(out[k]).argmax(axis=1)
    return None


class InferHandler:
    """`await handler(scope, receive, send, model, version)` answers one infer request.

    It does the guard's work itself (`web.guard.admit`: request id, body limit) rather than
    sit behind the middleware, which costs a coroutine layer and a closure per message."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx
        self.max_body = ctx.settings.max_body_bytes
        self._inflight: dict[str, Gauge] = {}
        self._latency: dict[tuple[str, str], Histogram] = {}
        self._responses: dict[tuple[str, str, int], Counter] = {}
        self._turn: list[tuple[str, str, int, float]] = []
        """(model label, version, status, seconds) of the requests finished this loop turn."""
        self._inflight_delta: dict[str, int] = {}
        self._flush_due = False
        ctx.metrics.flushers.append(self.flush)

    # -- metric children, looked up once ---------------------------------------------------------

    def _inflight_of(self, model: str) -> Gauge:
        g = self._inflight.get(model)
        if g is None:
            g = self._inflight[model] = self.ctx.metrics.inflight.labels(model)
        return g

    def _later(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write the metrics gathered since the last flush: the in-flight deltas and the
        latencies first, the responses counter last (a reader that sees a response counted
        sees its latency too)."""
        self._flush_due = False
        self.ctx.metrics.flush_gc()
        if self._inflight_delta:
            for model, d in self._inflight_delta.items():
                if d:
                    self._inflight_of(model).inc(d)
            self._inflight_delta.clear()
        if not self._turn:
            return
        done, self._turn = self._turn, []
        m = self.ctx.metrics
        seconds: dict[tuple[str, str], list[float]] = {}
        counts: dict[tuple[str, str, int], int] = {}
        for model, version, status, dt in done:
            if version:
                seconds.setdefault((model, version), []).append(dt)
            key = (model, version, status)
            counts[key] = counts.get(key, 0) + 1
        for (model, version), dts in seconds.items():
            h = self._latency.get((model, version))
            if h is None:
                h = self._latency[(model, version)] = m.request_seconds.labels(model, version)
            observe_many(h, dts)
        for key, n in counts.items():
            c = self._responses.get(key)
            if c is None:
                c = self._responses[key] = m.responses.labels(key[0], key[1], str(key[2]))
            c.inc(n)

    # -- per-request accounting, shared with the gRPC service -----------------------------------

    def begin(self, name: str) -> str:
        """Count a request in flight; returns its model label for `end`. A name that is not
        loaded is counted under model "": client-chosen names must not grow the metric
        series without bound."""
        label = name if name in self.ctx.repo.models else ""
        self._inflight_delta[label] = self._inflight_delta.get(label, 0) + 1
        self._later()
        return label

    def end(self, label: str, name: str, worker: VersionWorker | None, status: int, t0: float,
            rid: str, *, served: str, route: str = "infer") -> float:
        """A request begun at `t0` ended with `status` (HTTP's, or gRPC's mapped to it): the
        metrics (under version `served`, "" = none), the statistics of the `worker` it was
        routed to, and the access log. Returns its seconds."""
        dt = time.monotonic() - t0
        if worker is not None:
            (worker.stats.success if status == 200 else worker.stats.fail).add(int(dt * 1e9))
        self._inflight_delta[label] = self._inflight_delta.get(label, 0) - 1
        self._turn.append((label, served, status, dt))
        self._later()
        access = self.ctx.access
        if access.admit(status):
            access.write(status, route, request_id=rid, model=name, version=served,
                         latency_ms=round(dt * 1000, 3))
        return dt

    # -- the request -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send, name: str,
                       version: str | None) -> None:
        t0 = time.monotonic()
        guarded = (scope.get("state") or {}).get("request_id")
        if guarded:  # reached through FastAPI: the guard already counts and tags
            rid, stream, tags = str(guarded), False, []
        else:
            rid, too_big, stream = admit(scope, self.max_body)
            if too_big is not None:
                await send_error(send, 413, f"request body of {too_big} bytes exceeds the "
                                            f"{self.max_body}-byte limit", request_id=rid)
                return
            tags = [(_RID, rid.encode())]
        ctx = self.ctx
        repo = ctx.repo
        status, served = 500, ""
        worker: VersionWorker | None = None
        trace: RequestTrace | None = None
        encode_at = 0.0
        if ctx.tracing is not None:
            trace = ctx.tracing.begin("infer", scope["headers"], ns_mono(t0), attributes={
                "http.request.method": "POST", "http.route": "/v2/models/{name}/infer",
                "scalelab.model": name, "scalelab.request_id": rid})
            if trace is not None:  # the response names the server's span to the client
                tags = [*tags, (b"traceparent", trace.traceparent().encode())]
        label = self.begin(name)
        try:
            entry = repo.entry(name)
            if entry.config is None:
                raise HttpError(503, f"model '{name}' failed to load: {entry.reason}")
            cfg = entry.config
            body = await read_body(receive, self.max_body if stream else None)
            hlen: bytes | None = None
            tmo: bytes | None = None
            for k, v in scope["headers"]:
                if k == BINARY_HEADER:
                    hlen = v
                elif k == TIMEOUT_HEADER:
                    tmo = v
            head, tail = split_binary(body, None if hlen is None else hlen.decode("latin-1"))
            fast = fast_decode(parse_json_fast(head), cfg, tail)
            if fast is None:  # the full path on the raw body: its errors name the field
                req = validate_request(parse_json(head))
                arrays, want = decode_inputs(req, cfg, tail), wanted(req)
            else:
                arrays, want = fast
            deadline = t0 + timeout_s(tmo, cfg.dynamic_batching.default_timeout_ms)
            worker = repo.route(name, version, rid, entry)
            check_inputs(entry, worker, arrays)
            served = worker.version_label
            if trace is not None:
                trace.span("admission", ns_mono(t0), ns_mono(time.monotonic()))
            outputs = await self.compute(entry, worker, arrays, rid, deadline, trace)
            if trace is not None:
                encode_at = time.monotonic()
            shadow = repo.shadow_worker(name) if version is None else None
            if shadow is not None and shadow is not worker:
                task = asyncio.create_task(self._shadow(entry, shadow, arrays, rid, outputs))
                ctx.background.add(task)
                task.add_done_callback(ctx.background.discard)
            payload, headers = encode_outputs(model=name, version=worker.version, wanted=want,
                                              outputs=outputs, cfg=cfg)
            status = 200
            raw_headers = [_CT_JSON] if headers is JSON_HEADERS else \
                [(k.lower().encode(), v.encode()) for k, v in headers.items()]
            raw_headers.append((b"content-length", str(len(payload)).encode()))
            raw_headers += tags
            await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
            await send({"type": "http.response.body", "body": payload})
        except HttpError as e:
            status = e.status
            await send_error(send, e.status, e.message, extra_headers=tags + [
                (k.lower().encode(), v.encode()) for k, v in e.headers.items()])
        except HTTPException as e:  # BodyTooLarge while the body streamed in
            status = e.status_code
            await send_error(send, e.status_code, str(e.detail), extra_headers=tags)
        except Exception:
            log.exception("infer %s failed", name, extra={"request_id": rid})
            await send_error(send, 500, "internal server error; see the server log",
                             extra_headers=tags)
        finally:
            self.end(label, name, worker, status, t0, rid, served=served)
            if trace is not None:
                end = time.monotonic()
                if encode_at:
                    trace.span("post-processing", ns_mono(encode_at), ns_mono(end))
                trace.end(status, ns_mono(end),
                          {"scalelab.model.version": int(served)} if served else None)

    # -- compute: queue, cache, coalescing, shadow ----------------------------------------------

    @staticmethod
    async def _run(worker: VersionWorker, arrays: list[np.ndarray], rid: str, deadline: float,
                   *, log_sample: bool = True, trace: RequestTrace | None = None) -> Outputs:
        if trace is None:
            return await enqueue(worker, arrays, rid, deadline, log_sample=log_sample).future
        job = enqueue(worker, arrays, rid, deadline, log_sample=log_sample, traced=True)
        try:
            return await job.future
        finally:
            trace_job(trace, worker, job)

    async def compute(self, entry: ModelEntry, worker: VersionWorker, arrays: list[np.ndarray],
                      rid: str, deadline: float, trace: RequestTrace | None = None) -> Outputs:
        assert entry.config is not None
        cache = entry.cache
        coalesce = entry.config.cache.coalesce
        if not (cache is not None or coalesce):
            return await self._run(worker, arrays, rid, deadline, trace=trace)
        key = (entry.name, worker.version, input_key(arrays))
        if cache is not None:
            metrics = self.ctx.metrics
            t_look = time.perf_counter_ns()
            hit = cache.get(key)
            (worker.stats.cache_hit if hit is not None else worker.stats.cache_miss).add(
                time.perf_counter_ns() - t_look)
            if hit is not None:
                metrics.cache_hits.labels(entry.name, worker.version_label).inc()
                if trace is not None:
                    trace.root.set_attribute("scalelab.cache.hit", True)
                return hit
            metrics.cache_misses.labels(entry.name, worker.version_label).inc()
        if coalesce:
            out = await self._coalesced(entry, worker, arrays, rid, deadline, key, trace)
        else:
            out = await self._run(worker, arrays, rid, deadline, trace=trace)
        if cache is not None:
            cache.put(key, out)
        return out

    async def _coalesced(self, entry: ModelEntry, worker: VersionWorker,
                         arrays: list[np.ndarray], rid: str, deadline: float, key: Key,
                         trace: RequestTrace | None) -> Outputs:
        """Compute `key` as its leader, or await the identical request in flight (and compute
        it after all should that one's client go away)."""
        lead, fut = entry.coalescer.claim(key)
        if fut is not None:
            self.ctx.metrics.coalesced.labels(entry.name, worker.version_label).inc()
            try:
                return await asyncio.wait_for(asyncio.shield(fut),
                                              max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise HttpError(504, "deadline passed waiting for an identical in-flight "
                                      "request") from None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not fut.cancelled() or (task is not None and task.cancelling()):
                    raise
                # the leader's client went away; compute this one ourselves
            lead = entry.coalescer.lead(key)
        assert lead is not None
        try:
            if trace is None:  # _run's untraced path, one coroutine fewer
                out = await enqueue(worker, arrays, rid, deadline).future
            else:
                out = await self._run(worker, arrays, rid, deadline, trace=trace)
        except Exception as e:
            entry.coalescer.fail(key, lead, e)
            raise
        except BaseException:  # cancelled: this client went away, followers compute
            entry.coalescer.fail(key, lead, None)
            raise
        entry.coalescer.resolve(key, lead, out)
        return out

    async def _shadow(self, entry: ModelEntry, worker: VersionWorker, arrays: list[np.ndarray],
                      rid: str, primary: Outputs) -> None:
        assert entry.config is not None
        deadline = time.monotonic() + entry.config.dynamic_batching.default_timeout_ms / 1000
        try:
            other = await self._run(worker, arrays, rid, deadline, log_sample=False)
        except Exception:
            return  # the candidate failing or being full never touches the response
        a, b = labels_of(primary), labels_of(other)
        if a is None or b is None:
            return
        diff = int((a != b).sum())
        entry.shadow_compared += len(a)
        entry.shadow_disagreed += diff
        mv = (entry.name, str(worker.version))
        metrics = self.ctx.metrics
        metrics.shadow_compared.labels(*mv).inc(len(a))
        metrics.shadow_disagreed.labels(*mv).inc(diff)
