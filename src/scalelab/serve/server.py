"""Run the app under uvicorn: one process, or N workers sharing the port.

Graceful shutdown (SIGINT/SIGTERM): uvicorn stops accepting connections and waits up to
`graceful_s` for in-flight requests; then the app's lifespan drains every version's queue and
stops the inference threads. Workers rebuild the app from settings passed as JSON in the
environment (uvicorn needs an import string to start several processes).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from fastapi import FastAPI

from scalelab.core.errors import BadUsageError
from scalelab.serve import logs
from scalelab.serve.app import create_app
from scalelab.serve.config import ServerSettings

SETTINGS_ENV = "SCALELAB_SERVE_SETTINGS"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def app_from_env() -> FastAPI:
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


def serve(settings: ServerSettings) -> None:
    """Serve until interrupted (blocks)."""
    import uvicorn

    if not settings.model_repo.is_dir():
        raise BadUsageError(f"--model-repo {settings.model_repo} is not a directory")
    if settings.workers > 1:
        _multiproc_dir()
    os.environ[SETTINGS_ENV] = settings.to_json()
    logs.configure(settings.log_level)
    uvicorn.run("scalelab.serve.server:app_from_env", factory=True, host=settings.host,
                port=settings.port, workers=settings.workers, log_config=None,
                access_log=False, log_level=settings.log_level,
                timeout_graceful_shutdown=int(settings.graceful_s) or None)
