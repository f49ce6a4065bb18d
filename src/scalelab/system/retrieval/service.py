"""The retrieval server's handlers: `RetrievalService` holds the loaded retriever with its lock,
limits, metrics and tracing (one per process), and has one method per route; `retrieval.app`
puts them on their URLs. Handlers raise `HttpError` (web.errors), answered as
``{"error": message}`` with its status.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from scalelab.lab.core.errors import BadUsageError, ScalelabError
from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.guard import request_id
from scalelab.layers.web.hook import Hook, Inflight
from scalelab.layers.web.trace import RequestTrace
from scalelab.system.retrieval.settings import ADMIN_TOKEN_ENV, RetrievalServerSettings

log = logging.getLogger("scalelab.system.retrieval")


def _int_field(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise HttpError(422, f"field {name!r} must be an integer in {lo}..{hi}")
    if not lo <= v <= hi:
        raise HttpError(422, f"field {name!r} = {v} is outside {lo}..{hi}")
    return v


def _text_field(v: Any, name: str, limit: int) -> str:
    if not isinstance(v, str) or not v.strip():
        raise HttpError(422, f"field {name!r} must be a non-empty string")
    if len(v) > limit:
        raise HttpError(422, f"field {name!r} has {len(v)} characters; the limit is {limit}")
    return v


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HttpError(400, f"the body is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise HttpError(422, "the body must be a JSON object")
    return body


def served_model(listing: Any, url: str) -> str:
    """The one model id in an OpenAI ``GET /v1/models`` answer (pure: tested as is); an
    error naming what was listed when there is none or more than one."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise HttpError(502, f"{url} did not answer an OpenAI model list ({{'data': [...]}}); "
                             "give the model with --generate-model ID")
    ids = [m.get("id") for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if len(ids) != 1:
        raise HttpError(502, f"{url} lists {len(ids)} models {ids}; choose one with "
                             "--generate-model ID")
    return str(ids[0])


def prompt_messages(question: str, texts: list[str]) -> list[dict[str, str]]:
    """The chat messages for a retrieval-augmented answer (pure: tested as is)."""
    context = "\n".join(f"[{i + 1}] {t}" for i, t in enumerate(texts))
    return [{"role": "system",
             "content": "Answer the question using only the numbered facts. Be brief."},
            {"role": "user", "content": f"Facts:\n{context}\n\nQuestion: {question}"}]


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("scalelab_retrieval_requests", "Requests by route and status",
                                ["route", "code"], registry=self.registry)
        self.seconds = Histogram("scalelab_retrieval_request_seconds", "Request latency by route",
                                 ["route"], registry=self.registry,
                                 buckets=(.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5))
        self.inflight = Gauge("scalelab_retrieval_inflight", "Requests being worked on",
                              registry=self.registry)
        self.vectors = Gauge("scalelab_retrieval_index_vectors", "Vectors in the index",
                             registry=self.registry)
        self.rejected = Counter("scalelab_retrieval_rejected", "Requests refused by admission",
                                registry=self.registry)


class RetrievalService:
    """The retrieval server as an object: the loaded retriever with its lock, limits, metrics
    and tracing (one per process), and one handler method per route. The work routes'
    handlers take a `Request` and return the body as a dict or raise `HttpError` (wrap them
    with `route` for admission, metrics and tracing); the probes return a `Response`."""

    def __init__(self, settings: RetrievalServerSettings) -> None:
        from scalelab.system.retrieval.retriever import open_retriever

        self.settings = settings
        self.retriever, opened = open_retriever(
            settings.index_dir, cache=Path(settings.cache) if settings.cache else None)
        if opened.rebuilt:
            log.warning("index %s was refused and rebuilt from its corpus: %s",
                        settings.index_dir, opened.reason)
        self.opened = opened
        # faiss and hnswlib searches may run together, but not beside an add.
        self.lock = threading.Lock()
        self.prom = _Metrics()
        """The Prometheus families GET /metrics shows."""
        self.prom.vectors.set(self.retriever.index.ntotal)
        self.inflight = Inflight(settings.max_inflight)
        self.hook = Hook(settings.trace, "scalelab-retrieval")
        self.generate_model = settings.generate_model
        """The model /v1/answer asks for: the flag's, else the generate server's own (set on
        the first answer that could ask it, and kept)."""

    # -- the work routes' handlers -------------------------------------------------------

    async def retrieve(self, request: Request) -> dict[str, Any]:
        """POST /v1/retrieve: the k nearest documents of each query."""
        s = self.settings
        body = await _json_object(request)
        unknown = set(body) - {"query", "queries", "k"}
        if unknown:
            raise HttpError(422, f"unknown field(s) {', '.join(sorted(unknown))}; "
                                 "use query or queries, and k")
        if ("query" in body) == ("queries" in body):
            raise HttpError(422, "give exactly one of field 'query' (a string) or 'queries' "
                                 "(a list of strings)")
        if "query" in body:
            queries = [_text_field(body["query"], "query", s.max_query_chars)]
        else:
            qs = body["queries"]
            if not isinstance(qs, list) or not qs:
                raise HttpError(422, "field 'queries' must be a non-empty list of strings")
            if len(qs) > s.max_queries:
                raise HttpError(422, f"field 'queries' has {len(qs)} items; the limit is "
                                     f"{s.max_queries}")
            queries = [_text_field(q, f"queries[{i}]", s.max_query_chars)
                       for i, q in enumerate(qs)]
        k = _int_field(body, "k", 10, 1, s.max_k)
        t0 = time.perf_counter()
        results = await run_in_threadpool(self.search, queries, k, Hook.of(request))
        return {"results": results, "k": k, "index": self.retriever.index.spec,
                "ntotal": self.retriever.index.ntotal,
                "retrieve_ms": (time.perf_counter() - t0) * 1e3}

    async def answer(self, request: Request) -> dict[str, Any]:
        """POST /v1/answer: retrieve, then ask the generation server with the documents."""
        import httpx

        s = self.settings
        body = await _json_object(request)
        question = _text_field(body.get("question"), "question", s.max_query_chars)
        k = _int_field(body, "k", 5, 1, min(s.max_k, 20))
        if not s.generate_url:
            raise HttpError(503, "no generation server configured; start with "
                                 "--generate-url URL (an OpenAI-compatible server)")
        t0 = time.perf_counter()
        trace = Hook.of(request)
        hits = (await run_in_threadpool(self.search, [question], k, trace))[0]
        t1 = time.perf_counter()
        url = s.generate_url.rstrip("/") + "/v1/chat/completions"
        async with httpx.AsyncClient(timeout=s.generate_timeout_s) as client:
            model = await self.model_for_answer(client)
            payload = {"model": model, "temperature": 0, "max_tokens": s.answer_max_tokens,
                       "messages": prompt_messages(question, [h["text"] for h in hits])}
            # the generation server's spans join this trace
            with self.hook.call(trace, "generate", {
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                    "server.address": s.generate_url}) as call:
                try:
                    r = await client.post(url, json=payload, headers=call.headers)
                    call.status(r.status_code)
                    r.raise_for_status()
                    text = r.json()["choices"][0]["message"]["content"]
                except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
                    raise HttpError(502, f"the generation server at {url} failed: "
                                         f"{type(e).__name__}: {e}") from None
        return {"answer": text, "sources": hits,
                "retrieve_ms": (t1 - t0) * 1e3, "generate_ms": (time.perf_counter() - t1) * 1e3}

    async def documents(self, request: Request) -> dict[str, Any]:
        """POST /v1/documents (admin): embed and add documents, answerable at once."""
        token = os.environ.get(ADMIN_TOKEN_ENV, "")
        given = request.headers.get("authorization", "")
        if not token:
            raise HttpError(403, f"admin routes are off: set {ADMIN_TOKEN_ENV} to enable them")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HttpError(401, "admin route: send Authorization: Bearer <admin token>")
        body = await _json_object(request)
        docs = body.get("documents")
        if not isinstance(docs, list) or not docs or len(docs) > 1000:
            raise HttpError(422, "field 'documents' must be a list of 1..1000 {key, text}")
        pairs = []
        for i, d in enumerate(docs):
            if not isinstance(d, dict):
                raise HttpError(422, f"field 'documents[{i}]' must be an object {{key, text}}")
            pairs.append((_text_field(d.get("key"), f"documents[{i}].key", 200),
                          _text_field(d.get("text"), f"documents[{i}].text",
                                      self.settings.max_query_chars * 4)))
        t0 = time.perf_counter()
        try:
            n, ntotal = await run_in_threadpool(self.add, pairs)
        except BadUsageError as e:
            raise HttpError(409, str(e)) from None
        return {"added": n, "ntotal": ntotal,
                "add_ms": (time.perf_counter() - t0) * 1e3}

    # -- the probes' handlers -----------------------------------------------------------

    async def live(self, request: Request) -> Response:
        """GET /health/live."""
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        """GET /health/ready: the index is loaded (it is before the service exists)."""
        return JSONResponse({"ready": True, "index": self.retriever.index.spec,
                             "ntotal": self.retriever.index.ntotal,
                             "rebuilt_at_start": self.opened.rebuilt})

    async def metrics(self, request: Request) -> Response:
        """GET /metrics (Prometheus)."""
        return Response(generate_latest(self.prom.registry),
                        media_type="text/plain; version=0.0.4")

    # -- around the handlers ------------------------------------------------------------

    def route(self, name: str, handler: Callable[[Request], Awaitable[dict[str, Any]]]
              ) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """`handler` as a work route: traced, admitted under `max_inflight` (503 past it),
        its errors as `{"error": ...}` with their status, counted and timed as `name`."""
        hook, s, m = self.hook, self.settings, self.prom
        admission = self.inflight

        async def work(request: Request) -> Response:
            t0 = time.perf_counter()
            rid = request_id(request.scope)
            if admission.full():
                m.rejected.inc()
                m.requests.labels(name, "503").inc()
                return JSONResponse({"error": f"busy: {admission.count} requests in flight "
                                              f"(limit {s.max_inflight}); retry"},
                                    status_code=503, headers={"Retry-After": "1"})
            admission.enter()
            m.inflight.set(admission.count)
            try:
                out = await handler(request)
                status, resp = 200, JSONResponse(out)
            except HttpError as e:
                status, resp = e.status, JSONResponse({"error": str(e)}, status_code=e.status)
            except ScalelabError as e:
                status, resp = 422, JSONResponse({"error": str(e)}, status_code=422)
            finally:
                admission.leave()
                m.inflight.set(admission.count)
            m.requests.labels(name, str(status)).inc()
            m.seconds.labels(name).observe(time.perf_counter() - t0)
            if status >= 400:
                log.info("%s %s -> %d (%s)", name, rid, status, resp.body[:200])
            return resp

        async def traced(request: Request) -> Response:
            path = request.url.path
            trace = hook.begin(request, f"POST {path}", time.perf_counter(), {
                "http.request.method": "POST", "http.route": path,
                "scalelab.request_id": request_id(request.scope)})
            return hook.end(trace, await work(request))

        # tracing off: the route is `work` itself, not a wrapper that asks on every request
        return work if hook.tracing is None else traced

    @asynccontextmanager
    async def lifespan(self, _: Starlette) -> AsyncIterator[None]:
        yield
        self.hook.shutdown()  # export the spans still queued

    # -- the work itself ----------------------------------------------------------------

    async def model_for_answer(self, client: Any) -> str:
        """The model id for /v1/answer's chat request; asks the generate server once when no
        --generate-model was given (a failed ask is retried by the next answer)."""
        if self.generate_model is None:
            import httpx

            assert self.settings.generate_url is not None
            url = self.settings.generate_url.rstrip("/") + "/v1/models"
            try:
                r = await client.get(url)
                r.raise_for_status()
                listing = r.json()
            except (httpx.HTTPError, ValueError) as e:
                raise HttpError(502, f"could not ask {url} which model it serves "
                                     f"({type(e).__name__}: {e}); is the generate server up? "
                                     "Or give the model with --generate-model ID") from None
            self.generate_model = served_model(listing, url)
            log.info("generate server %s serves model %r", self.settings.generate_url,
                     self.generate_model)
        return self.generate_model

    def search(self, queries: list[str], k: int, trace: RequestTrace | None = None
               ) -> list[list[dict[str, Any]]]:
        """The k hits of each query (run in a worker thread: embedding and search block)."""
        t0 = time.perf_counter()
        vecs = self.retriever.embedder.embed(queries)
        t1 = time.perf_counter()
        with self.lock:
            hits = self.retriever.search_vectors(vecs, k)
        # search includes the wait for the index lock (an add holds it)
        t2 = time.perf_counter()
        index = self.retriever.index
        self.hook.child(trace, "embed", t0, t1, {"scalelab.queries": len(queries)})
        self.hook.child(trace, "search", t1, t2, {
            "scalelab.index.kind": index.spec, "scalelab.index.ntotal": index.ntotal,
            "scalelab.k": k, "scalelab.queries": len(queries)})
        return [[asdict(h) for h in row] for row in hits]

    def add(self, docs: list[tuple[str, str]]) -> tuple[int, int]:
        """(documents added, index size right after them): read under the lock, so concurrent
        adds each report the size their own add made, never another's."""
        with self.lock:
            added = self.retriever.add(docs)
            ntotal = self.retriever.index.ntotal
            self.prom.vectors.set(ntotal)
        return len(added), ntotal
