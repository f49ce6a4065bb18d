"""What a generator process sends, whatever the protocol: the target parsed from a URL, the
bytes of an HTTP/1.1 request, how the answer's body is framed, and the send settings both
engines take (`SendConfig`)."""

from __future__ import annotations

import json
import ssl as _ssl
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.schedule import Mode


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where requests go: parsed from a URL once, before the run."""

    scheme: str
    """http, https or grpc (the KServe v2 gRPC protocol, load.grpc_client)."""
    host: str
    """Host name or IP to connect to."""
    port: int
    """TCP port."""
    path: str
    """Path and query of the URL ("/" when none)."""
    host_header: str = field(default="")
    """Value of the Host header (host[:port])."""

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "grpc") or not parts.hostname:
            raise BadUsageError(
                f"URL {url!r} is not an http(s) or grpc URL; give e.g. "
                "http://127.0.0.1:8000/v2/health/ready or grpc://127.0.0.1:8001/MODEL"
            )
        try:
            port = parts.port or {"https": 443, "grpc": 8001}.get(parts.scheme, 80)
        except ValueError as e:
            raise BadUsageError(f"URL {url!r} has a bad port: {e}") from e
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        default = port == (443 if parts.scheme == "https" else 80)
        hh = parts.hostname if default else f"{parts.hostname}:{port}"
        return cls(scheme=parts.scheme, host=parts.hostname, port=port, path=path, host_header=hh)

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host_header}"

    def ssl_context(self) -> _ssl.SSLContext | None:
        return _ssl.create_default_context() if self.scheme == "https" else None


def build_request(target: Target, *, method: str, path: str, body: bytes | None,
                  headers: dict[str, str] | None = None) -> bytes:
    """The exact bytes of one HTTP/1.1 request (built once per distinct request, reused)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {target.host_header}",
             "User-Agent: scalelab-load"]
    extra = dict(headers or {})
    if body is not None:
        extra.setdefault("Content-Type", "application/json")
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{k}: {v}" for k, v in extra.items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body or b"")


CHUNKED = -2
"""`body_framing`: the body comes in chunks (Transfer-Encoding: chunked)."""


def body_framing(head: bytes) -> int | None:
    """How the body after a response head (lower-cased, up to the blank line) is framed: its
    Content-Length, `CHUNKED`, or None when the head says neither. It runs once a response on
    the generator's loop, so it looks for two byte strings rather than parsing every header."""
    i = head.find(b"\r\ncontent-length:")
    if i >= 0:
        j = head.find(b"\r\n", i + 2)
        return int(head[i + 17: j if j >= 0 else None])
    return CHUNKED if b"\r\ntransfer-encoding: chunked" in head else None


@dataclass(kw_only=True)
class SendConfig:
    """What one generator process sends and how, for plain requests and token streams alike
    (`http.generator.HttpConfig`, `llm.stream.StreamConfig`); validated at construction."""

    target: Target
    """Where to connect."""
    requests: list[bytes]
    """Encoded requests, used round-robin."""
    mode: Mode = "open"
    """Open loop (schedule) or closed loop (concurrency)."""
    concurrency: int = 1
    """Closed loop: clients, each with one request outstanding."""
    duration_s: float | None = None
    """Closed loop: how long to send (including warm-up); None with `max_requests`."""
    max_requests: int | None = None
    """Closed loop: measured requests to send (after warm-up)."""
    warmup_s: float = 0.0
    """Requests due (open) or sent (closed) in the first `warmup_s` are not measured."""
    timeout_s: float = 10.0
    """A request not answered this long after its due time fails with kind "timeout"."""
    max_connections: int = 1024
    """Open loop: most connections to open; past it requests wait for one (still timed)."""
    trace_sample: float = 0.0
    """Share of measured requests sent with a fresh sampled traceparent (0 = none)."""
    trace_seed: int = 0
    """Seed of which requests those are."""
    window_s: float | None = None
    """Open loop: the measured window's planned length (after the warm-up). Set, the served
    rate counts every success completed inside it (`Part.served_in_window`): an overloaded
    level's warm-up leaves a queue that the measured requests wait behind, and their span
    would stretch past the window and read as a lower capacity."""

    def __post_init__(self) -> None:
        if not self.requests:
            raise BadUsageError("no requests to send; the payload (or workload) produced nothing")
        if self.mode not in ("open", "closed"):
            raise BadUsageError(f"mode must be open or closed, got {self.mode!r}")
        if self.concurrency < 1:
            raise BadUsageError(f"--concurrency must be at least 1, got {self.concurrency}")
        if not (self.timeout_s > 0):
            raise BadUsageError(f"--timeout must be positive, got {self.timeout_s}")
        if self.warmup_s < 0:
            raise BadUsageError(f"--warmup must be >= 0, got {self.warmup_s}")
        if self.max_connections < 1:
            raise BadUsageError(f"--max-connections must be at least 1, got {self.max_connections}")
        if not 0.0 <= self.trace_sample <= 1.0:
            raise BadUsageError(f"--trace-sample must lie in [0, 1], got {self.trace_sample}")


def served_model(target: Target) -> str | None:
    """The first model GET /v1/models lists (OpenAI servers that check the `model` field
    refuse any other); None when the server does not say."""
    try:
        with urllib.request.urlopen(f"{target.base}/v1/models", timeout=5) as r:
            doc = json.loads(r.read())
        data = doc.get("data") if isinstance(doc, dict) else None
        first = data[0].get("id") if isinstance(data, list) and data and \
            isinstance(data[0], dict) else None
        return str(first) if first else None
    except (OSError, ValueError):
        return None
