"""How one server process runs (`ServerSettings`). A model's serving config
(REPO/<model>/config.json: tensors, batching, version policy) is the model repository's, in
layers/nets/model_config.py, read by the server and by the lab that writes it alike.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.trace import TraceConfig


@dataclass(kw_only=True)
class ServerSettings:
    """How one server process runs (CLI flags; passed to uvicorn workers as JSON)."""

    model_repo: Path
    """Root of the model repository."""
    host: str = "127.0.0.1"
    """Bind address; only listen beyond this machine when told to."""
    port: int = 8000
    grpc_port: int | None = None
    """Also serve the KServe v2 gRPC protocol on this port, bound to `host` (None = off).
    With several workers each binds it (SO_REUSEPORT) and the kernel spreads connections."""
    workers: int = 1
    """uvicorn worker processes (metrics merge through PROMETHEUS_MULTIPROC_DIR)."""
    admin_token: str | None = None
    """Bearer token for the repository admin endpoints; None disables them (403)."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted; larger ones get 413."""
    sample_dir: Path | None = None
    """Where the rotating request sample goes; None = no sampling."""
    sample_rate: float = 1.0
    sample_max_rows: int = 10_000
    sample_max_files: int = 10
    poll_s: float = 0.5
    """How often serving.json files are checked for changes."""
    graceful_s: float = 30.0
    """How long shutdown waits for in-flight requests and queues to finish."""
    log_level: str = "info"
    torch_threads: int | None = None
    """torch intra-op threads per process; None = cores / workers."""
    gil_switch_ms: float = 0.5
    """Python's GIL switch interval (CPython's default is 5 ms). The inference thread drops the
    GIL at every torch op and, while the event loop is busy parsing requests, waits a whole
    interval to get it back: measured here, batches took 10x longer and p50 latency at 100 req/s
    went from 6 ms to 1.2 s at the default. Shorter intervals cost a few more thread switches."""

    read_timeout_s: float = 10.0
    """How long a client may take to send one whole request (head and body) once it has sent
    its first byte or opened the connection; then the connection is closed. uvicorn's h11
    protocol has no such limit, so a client trickling headers a byte at a time (slowloris)
    would hold its connection forever. Costs: a legitimate client on a link slower than
    max_body / read_timeout_s (about 100 KiB/s at the defaults) is cut off."""
    http: str = "auto"
    """HTTP parser: auto (httptools when installed, else h11), httptools or h11."""
    loop: str = "auto"
    """Event loop: auto (uvloop when installed, else asyncio), uvloop or asyncio."""
    access_log: str = "sampled"
    """off, sampled (every request while light, at most access_log_per_second lines a second
    for successes and as many for errors when not) or full (one line per request)."""
    access_log_per_second: float = 20.0
    governance_file: str | None = None
    """A governance file (rate limits, budgets, kill switches; web.governance); None = no
    governance layer at all."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """Request tracing (off unless it has somewhere to send spans; see web.trace)."""

    def __post_init__(self) -> None:
        self.model_repo = Path(self.model_repo)
        self.trace = TraceConfig.of(self.trace)  # a dict when it came through JSON
        if self.sample_dir is not None:
            self.sample_dir = Path(self.sample_dir)
        if not 0 < self.port < 65536:
            raise BadUsageError(f"--port {self.port} must lie in 1..65535")
        if self.grpc_port is not None and not (0 < self.grpc_port < 65536
                                               and self.grpc_port != self.port):
            raise BadUsageError(f"--grpc-port {self.grpc_port} must lie in 1..65535 and differ "
                                "from --port")
        if self.grpc_port is not None and self.governance_file:
            # the governance layer wraps the HTTP app: gRPC calls would pass its limits,
            # budgets and kill switches by
            raise BadUsageError("--governance applies to HTTP only; drop --grpc-port (or "
                                "--governance) so no call bypasses it")
        if self.workers < 1:
            raise BadUsageError("--workers must be >= 1")
        if self.governance_file and self.workers > 1:
            # each worker would keep its own buckets, budgets and kill switches, and an admin
            # call reaches one of them: a kill switch that stops 1 of N workers is worse than none
            raise BadUsageError("--governance keeps its state in one process: use --workers 1 "
                                "(or one governed server per process behind a gateway)")
        if self.max_body_bytes < 1024:
            raise BadUsageError("--max-body must be at least 1 KiB")
        if not 0 < self.sample_rate <= 1:
            raise BadUsageError("--sample-rate must lie in (0, 1]")
        if not 0.05 <= self.gil_switch_ms <= 100:
            raise BadUsageError("the GIL switch interval must lie in [0.05, 100] ms")
        if not 0 < self.read_timeout_s <= 3600:
            raise BadUsageError("--read-timeout must lie in (0, 3600] seconds")
        if self.access_log not in ("off", "sampled", "full"):
            raise BadUsageError(f"--access-log {self.access_log!r} must be off, sampled or full")
        if self.access_log_per_second <= 0:
            raise BadUsageError("--access-log-rate must be > 0 lines per second")
        if self.poll_s <= 0 or self.graceful_s < 0:
            raise BadUsageError("poll interval must be > 0 and graceful timeout >= 0")

    def to_json(self) -> str:
        d = asdict(self)
        d["model_repo"] = str(self.model_repo)
        d["sample_dir"] = str(self.sample_dir) if self.sample_dir else None
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> ServerSettings:
        return cls(**json.loads(text))
