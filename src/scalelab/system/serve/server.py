"""Run the app under uvicorn: one process, or N workers sharing the port.

Graceful shutdown (SIGINT/SIGTERM): uvicorn stops accepting connections and waits up to
`graceful_s` for in-flight requests; then the app's lifespan drains every version's queue and
stops the inference threads. Workers rebuild the app from settings passed as JSON in the
environment (uvicorn needs an import string to start several processes). The uvicorn settings
(parser, loop, read timeout) are the shared ones in `scalelab.layers.web.runner`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile

from starlette.types import ASGIApp

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.runner import UvicornConfig, run
from scalelab.system.serve import logs
from scalelab.system.serve.app import create_app
from scalelab.system.serve.settings import ServerSettings

SETTINGS_ENV = "SCALELAB_SERVE_SETTINGS"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def app_from_env() -> ASGIApp:
    """uvicorn factory: the app for the settings in $SCALELAB_SERVE_SETTINGS."""
    raw = os.environ.get(SETTINGS_ENV)
    if raw is None:
        raise BadUsageError(f"{SETTINGS_ENV} is not set; start the server with `scalelab serve`")
    settings = ServerSettings.from_json(raw)
    logs.configure(settings.log_level)
    return create_app(settings)


def _multiproc_dir() -> None:
    """Several workers: give prometheus-client a fresh shared directory unless one is set.
    It must exist before the workers import prometheus_client (they inherit the env)."""
    if os.environ.get(MULTIPROC_ENV):
        return
    d = tempfile.mkdtemp(prefix="scalelab-prom-")
    os.environ[MULTIPROC_ENV] = d
    atexit.register(shutil.rmtree, d, True)


def run_config(settings: ServerSettings) -> UvicornConfig:
    """The uvicorn settings for these server settings."""
    return UvicornConfig(host=settings.host, port=settings.port, workers=settings.workers,
                         http=settings.http, loop=settings.loop,
                         read_timeout_s=settings.read_timeout_s, graceful_s=settings.graceful_s,
                         log_level=settings.log_level)


def check_free(host: str, port: int, flag: str) -> None:
    """BadUsageError when host:port cannot be bound now (a plain bind, without SO_REUSEPORT,
    so a listener that set it is found too). Why before starting: a gRPC port that fails to
    bind inside the app's startup ends in uvicorn's traceback, not a message."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise BadUsageError(f"{flag} {port}: cannot bind {host}:{port} ({e.strerror}); "
                                "pick a free port") from None


def serve(settings: ServerSettings) -> None:
    """Serve until interrupted (blocks)."""
    if not settings.model_repo.is_dir():
        raise BadUsageError(f"--model-repo {settings.model_repo} is not a directory")
    if settings.grpc_port is not None:
        check_free(settings.host, settings.grpc_port, "--grpc-port")
    cfg = run_config(settings)
    if settings.workers > 1:
        _multiproc_dir()
    os.environ[SETTINGS_ENV] = settings.to_json()
    logs.configure(settings.log_level)
    run("scalelab.system.serve.server:app_from_env", cfg)
