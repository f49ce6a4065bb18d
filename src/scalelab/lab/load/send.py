"""What a generator process sends, whatever the protocol: the target parsed from a URL (with the
headers and TLS trust every request to it carries), the bytes of an HTTP/1.1 request, how the
answer's head is read (body framing, whether the server keeps the connection), and the send
settings both engines take (`SendConfig`)."""

from __future__ import annotations

import json
import ssl as _ssl
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Any
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
    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every request to this target (-H, --api-key), after the payload's own: a
    user's header replaces the payload's header of the same name."""
    cafile: str | None = None
    """https: trust this CA bundle (PEM) instead of the system's (--cacert)."""
    insecure: bool = False
    """https: verify neither the certificate nor the host name (--insecure)."""

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
        """https: a context offering only HTTP/1.1 by ALPN (an HTTP/2-only server then refuses
        the handshake, which the client reports as such); None for http."""
        if self.scheme != "https":
            return None
        try:
            ctx = _ssl.create_default_context(cafile=self.cafile)
        except (OSError, _ssl.SSLError) as e:
            raise BadUsageError(f"--cacert {self.cafile}: cannot read it as a PEM CA bundle "
                                f"({e}); give the CA certificate that signed the server's") from e
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = _ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def urlopen(self, url: str, *, timeout_s: float = 10.0) -> IO[Any]:
        """GET `url` (on this target's server) with the target's headers and TLS trust: the
        side requests a run makes (model metadata, /v1/models) authenticate like the load."""
        req = urllib.request.Request(url, headers=dict(self.headers))
        ctx = self.ssl_context() if url.startswith("https:") else None
        return urllib.request.urlopen(req, timeout=timeout_s, context=ctx)


def build_request(target: Target, *, method: str, path: str, body: bytes | None,
                  headers: dict[str, str] | None = None) -> bytes:
    """The exact bytes of one HTTP/1.1 request (built once per distinct request, reused)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {target.host_header}",
             "User-Agent: scalelab-load"]
    extra = dict(headers or {})
    for name, value in target.headers:
        for k in [k for k in extra if k.lower() == name.lower()]:
            del extra[k]
        extra[name] = value
    if body is not None:
        extra.setdefault("Content-Type", "application/json")
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{k}: {v}" for k, v in extra.items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body or b"")


CHUNKED = -2
"""`body_framing`: the body comes in chunks (Transfer-Encoding: chunked)."""


class ProtocolError(Exception):
    """The server's bytes are not an HTTP/1.x response we can frame."""


H2_REFUSAL = ("the server answered in HTTP/2 (a binary frame, not an HTTP/1.x status line): "
              "scalelab load speaks HTTP/1.1; give the server's HTTP/1.1 port or put an "
              "HTTP/1.1 proxy in front of it")
"""Why a request to an HTTP/2-only server failed (kind "protocol")."""


def header_value(head: bytes, name: bytes) -> bytes | None:
    """The value of header `name` (lower-case, no colon) in a lower-cased response head, or
    None. One `find` per header asked (a response reads three): cheap on the hot path."""
    i = head.find(b"\r\n" + name + b":")
    if i < 0:
        return None
    start = i + len(name) + 3
    j = head.find(b"\r\n", start)
    return head[start: j if j >= 0 else None].strip()


def status_of(head: bytes) -> int:
    """The status code of a lower-cased response head; ProtocolError when it is not HTTP/1.x
    (an HTTP/2 frame gets `H2_REFUSAL`)."""
    if not head.startswith(b"http/1."):
        if len(head) >= 9 and head[3] in (0x04, 0x07) and head[:3] != b"htt":
            raise ProtocolError(H2_REFUSAL)  # SETTINGS or GOAWAY: an HTTP/2 frame header
        raise ProtocolError(f"not an HTTP/1.x response: {head[:40]!r}")
    try:
        return int(head[9:12])
    except ValueError:
        raise ProtocolError(f"bad status line: {head[:40]!r}") from None


def keeps_alive(head: bytes) -> bool:
    """Whether the server keeps the connection after this response: HTTP/1.1 unless it says
    `Connection: close`; HTTP/1.0 only when it says `Connection: keep-alive`."""
    conn = header_value(head, b"connection")
    if head.startswith(b"http/1.0"):
        return conn is not None and b"keep-alive" in conn
    return conn is None or b"close" not in conn


def body_framing(head: bytes) -> int | None:
    """How the body after a response head (lower-cased, up to the blank line) is framed: its
    Content-Length, `CHUNKED` (Transfer-Encoding ending in chunked wins over a length, as
    RFC 9112 says), or None when the head says neither (the body runs to the close)."""
    te = header_value(head, b"transfer-encoding")
    if te is not None and te.endswith(b"chunked"):
        return CHUNKED
    cl = header_value(head, b"content-length")
    if cl is None:
        return None
    try:
        n = int(cl)
    except ValueError:
        raise ProtocolError(f"bad Content-Length {cl[:40]!r}") from None
    if n < 0:
        raise ProtocolError(f"negative Content-Length {n}")
    return n


def retry_after_s(head: bytes) -> float | None:
    """Retry-After of a refusal (503, 429) in seconds; an HTTP date counts from now. None
    when absent or unreadable."""
    v = header_value(head, b"retry-after")
    if v is None:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    import email.utils
    import time

    try:
        when = email.utils.parsedate_to_datetime(v.decode("latin-1"))
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def is_interim(status: int) -> bool:
    """A 1xx answer other than 101: a head that precedes the real response (100 Continue,
    103 Early Hints), skipped."""
    return 100 <= status < 200 and status != 101


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
        with target.urlopen(f"{target.base}/v1/models", timeout_s=5) as r:
            doc = json.loads(r.read())
        data = doc.get("data") if isinstance(doc, dict) else None
        first = data[0].get("id") if isinstance(data, list) and data and \
            isinstance(data[0], dict) else None
        return str(first) if first else None
    except (OSError, ValueError):
        return None
