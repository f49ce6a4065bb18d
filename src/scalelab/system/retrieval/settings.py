"""What `scalelab retrieval serve` configures: one dataclass, carried to the server process (a
uvicorn worker) as JSON in $SCALELAB_RETRIEVAL_SETTINGS."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.trace import TraceConfig

SETTINGS_ENV = "SCALELAB_RETRIEVAL_SETTINGS"
ADMIN_TOKEN_ENV = "SCALELAB_ADMIN_TOKEN"
"""The bearer token of POST /v1/documents (unset: the admin routes are off)."""


@dataclass(kw_only=True)
class RetrievalServerSettings:
    """What the server serves and its limits."""

    index_dir: str
    """An index directory written by `scalelab retrieval index`."""
    cache: str | None = None
    """Embedding cache file (queries seen before skip the model)."""
    max_k: int = 100
    """Largest k a request may ask for."""
    max_query_chars: int = 2000
    """Longest query accepted (MiniLM reads 256 tokens at most anyway)."""
    max_queries: int = 32
    """Queries per /v1/retrieve request."""
    max_inflight: int = 16
    """Requests worked on at once; the next one gets 503."""
    max_body_bytes: int = 256 * 1024
    generate_url: str | None = None
    """Base URL of an OpenAI-compatible server for /v1/answer (None: the route answers 503)."""
    generate_model: str | None = None
    """The `model` field of /v1/answer's chat requests; None: the one model the generate
    server lists at GET /v1/models (asked once, on the first answer)."""
    generate_timeout_s: float = 60.0
    answer_max_tokens: int = 64
    governance_file: str | None = None
    """Rate limits, budgets and kill switches (web.governance); None = no governance layer."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """Request tracing (web.trace): embed and search spans; /v1/answer's call to the
    generation server carries the trace on."""

    def __post_init__(self) -> None:
        self.trace = TraceConfig.of(self.trace)  # a dict when it came through JSON
        if self.max_k < 1 or self.max_query_chars < 1 or self.max_queries < 1:
            raise BadUsageError("max_k, max_query_chars and max_queries must be >= 1")
        if self.max_inflight < 1 or self.max_body_bytes < 1:
            raise BadUsageError("max_inflight and max_body_bytes must be >= 1")
        if self.answer_max_tokens < 1 or not self.generate_timeout_s > 0:
            raise BadUsageError("answer_max_tokens >= 1 and generate_timeout_s > 0 required")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RetrievalServerSettings:
        return cls(**json.loads(text))
