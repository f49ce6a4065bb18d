"""Run an ASGI app under uvicorn with the project's settings.

What every server here gets: 127.0.0.1 unless told otherwise; no proxy-headers middleware
(X-Forwarded-For is not trusted); the read-timeout protocol
(`web.timeouts`); uvicorn's own access log off (servers write theirs through `web.access`);
logging left to the caller (`log_config=None`); a graceful-shutdown bound; and the fastest
HTTP parser and event loop installed — httptools (C, llhttp) over the pure-Python h11, uvloop
(libuv) over asyncio's loop — with the pure ones as the fallback when those are absent
(`pip install 'scalelab[serve]'` brings them).

Several worker processes share one listening socket: uvicorn binds it in the parent and each
worker accepts from it; uvicorn needs an import string (`module:factory`) to start them.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Literal

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.timeouts import H11_PATH, HTTPTOOLS_PATH, READ_TIMEOUT_ENV

Http = Literal["auto", "httptools", "h11"]
Loop = Literal["auto", "uvloop", "asyncio"]
HTTP_CHOICES: tuple[str, ...] = ("auto", "httptools", "h11")
LOOP_CHOICES: tuple[str, ...] = ("auto", "uvloop", "asyncio")


def has_module(name: str) -> bool:
    """Whether `name` is importable here (without importing it)."""
    return importlib.util.find_spec(name) is not None


def resolve_http(choice: str) -> str:
    """'httptools' or 'h11' for a choice of auto / httptools / h11."""
    return _resolve("http", choice, HTTP_CHOICES, fast="httptools", plain="h11")


def resolve_loop(choice: str) -> str:
    """'uvloop' or 'asyncio' for a choice of auto / uvloop / asyncio."""
    return _resolve("loop", choice, LOOP_CHOICES, fast="uvloop", plain="asyncio")


def _resolve(flag: str, choice: str, choices: tuple[str, ...], *, fast: str, plain: str) -> str:
    """auto: `fast` when its package (of the same name) is installed, else `plain`; `fast` asked
    for by name must be installed."""
    if choice not in choices:
        raise BadUsageError(f"--{flag} {choice!r} is not one of {', '.join(choices)}")
    if choice == "auto":
        return fast if has_module(fast) else plain
    if choice == fast and not has_module(fast):
        raise BadUsageError(f"--{flag} {fast} needs the {fast} package: "
                            f"pip install 'scalelab[serve]' (or --{flag} {plain})")
    return choice


def protocol_path(http: str) -> str:
    """The import string of the read-timeout protocol for a resolved parser name."""
    return HTTPTOOLS_PATH if http == "httptools" else H11_PATH


@dataclass(kw_only=True, frozen=True)
class UvicornConfig:
    """How uvicorn runs an app."""

    host: str = "127.0.0.1"
    """Bind address; only listen beyond this machine when told to."""
    port: int = 8000
    workers: int = 1
    """Processes accepting on the one port (each builds its own app)."""
    http: str = "auto"
    """HTTP parser: auto (httptools if installed), httptools or h11."""
    loop: str = "auto"
    """Event loop: auto (uvloop if installed), uvloop or asyncio."""
    read_timeout_s: float = 10.0
    """Most seconds a client may take to send one whole request (see web.timeouts)."""
    keep_alive_s: int = 5
    """How long an idle keep-alive connection stays open."""
    graceful_s: float = 30.0
    """How long shutdown waits for in-flight requests; 0 = no bound."""
    log_level: str = "info"
    backlog: int = 2048
    """Listen queue length: connections the kernel holds before the server accepts them."""
    worker_healthcheck_s: int = 30
    """With several workers: how long one may take to answer the supervisor's ping before it
    is killed and replaced. uvicorn's 5 s killed workers still importing torch on a busy
    2-core machine (20 s to start), over and over."""

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise BadUsageError(f"--port {self.port} must lie in 1..65535")
        if self.workers < 1:
            raise BadUsageError("--workers must be >= 1")
        if not 0 < self.read_timeout_s <= 3600:
            raise BadUsageError("--read-timeout must lie in (0, 3600] seconds")
        if self.keep_alive_s <= 0 or self.graceful_s < 0 or self.backlog < 1:
            raise BadUsageError("keep-alive must be > 0 s, graceful >= 0 s and backlog >= 1")
        resolve_http(self.http)
        resolve_loop(self.loop)


def run(target: str, cfg: UvicornConfig, *, factory: bool = True) -> None:
    """Serve `target` ("module:attr", an app factory when `factory`) until interrupted."""
    import inspect

    import uvicorn

    extra: dict[str, Any] = {}
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.run).parameters:
        extra["timeout_worker_healthcheck"] = cfg.worker_healthcheck_s  # newer uvicorn only
    # workers are new processes: the limit travels in the environment they inherit
    os.environ[READ_TIMEOUT_ENV] = repr(cfg.read_timeout_s)
    uvicorn.run(target, factory=factory, host=cfg.host, port=cfg.port, workers=cfg.workers,
                log_config=None, access_log=False, log_level=cfg.log_level,
                http=protocol_path(resolve_http(cfg.http)), loop=resolve_loop(cfg.loop),
                timeout_keep_alive=cfg.keep_alive_s, backlog=cfg.backlog,
                # X-Forwarded-* is not trusted (servers bind 127.0.0.1 unless told otherwise),
                # and the middleware that reads it is a layer every request paid for
                proxy_headers=False,
                timeout_graceful_shutdown=int(cfg.graceful_s) or None, **extra)
