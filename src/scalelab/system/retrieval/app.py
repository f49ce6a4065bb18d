"""The retrieval server's app: POST /v1/retrieve, a retrieval-augmented answer path, admin adds.

Routes:

- ``POST /v1/retrieve`` ``{"query": "...", "k": 10}`` (or ``"queries": [...]``) ->
  ``{"results": [[{"id", "key", "score", "text"}, ...]], "index", "ntotal"}``;
- ``POST /v1/answer`` ``{"question": "...", "k": 5}`` -> retrieve, put the documents and the
  question in a prompt, post it to an OpenAI-compatible ``/v1/chat/completions`` (the
  `--generate-url` server, e.g. `scalelab generate serve`) -> ``{"answer", "sources", ...}``;
- ``POST /v1/documents`` (admin: ``Authorization: Bearer $SCALELAB_ADMIN_TOKEN``)
  ``{"documents": [{"key", "text"}]}`` -> embedded and added now, answerable by the next query
  (the freshness path; the index file on disk is not rewritten);
- ``GET /health/live``, ``GET /health/ready``, ``GET /metrics`` (Prometheus).

Conventions shared with the other servers (`scalelab.layers.web`): bodies bounded by the guard
(413), a request id on every response, 127.0.0.1 by default, bad input answered 4xx with
``{"error": ...}`` naming the field. Admission: at most `max_inflight` requests are worked on at
once; the next is answered 503 with Retry-After instead of queueing without bound. The index is
loaded (or, when its file is refused, rebuilt from the corpus) before the server says ready: a
corrupted index is never served.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.access import AccessLog
from scalelab.layers.web.hook import admitted
from scalelab.system.retrieval.service import RetrievalService
from scalelab.system.retrieval.settings import (
    ADMIN_TOKEN_ENV,
    SETTINGS_ENV,
    RetrievalServerSettings,
)


def create_app(settings: RetrievalServerSettings) -> Any:
    """The ASGI app for `settings`: the service's handler methods on their routes, behind the
    shared hook (web.hook); loads the index before returning."""
    svc = RetrievalService(settings)
    app = Starlette(lifespan=svc.lifespan, routes=[
        Route("/v1/retrieve", svc.route("retrieve", svc.retrieve), methods=["POST"]),
        Route("/v1/answer", svc.route("answer", svc.answer), methods=["POST"]),
        Route("/v1/documents", svc.route("documents", svc.documents), methods=["POST"]),
        Route("/health/live", svc.live, methods=["GET"]),
        Route("/health/ready", svc.ready, methods=["GET"]),
        Route("/metrics", svc.metrics, methods=["GET"]),
    ])
    app.state.service = svc
    model = Path(settings.index_dir).name  # the "model" a budget or kill switch names: the index

    def work(scope: Any) -> str | None:
        return model if scope["method"] == "POST" and scope["path"] in (
            "/v1/retrieve", "/v1/answer") else None

    return admitted(app, max_body=settings.max_body_bytes,
                    access=AccessLog("scalelab.system.retrieval.access"),
                    governance=settings.governance_file, work=work,
                    admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None)


def app_from_env() -> Any:
    """uvicorn's factory (workers import it by name): settings come from $SCALELAB_RETRIEVAL_
    SETTINGS as JSON, which `scalelab retrieval serve` sets."""
    raw = os.environ.get(SETTINGS_ENV)
    if not raw:
        raise BadUsageError(f"{SETTINGS_ENV} is not set; start the server with "
                            "'scalelab retrieval serve'")
    return create_app(RetrievalServerSettings.from_json(raw))
