"""Structured logs of the model server: web.logs' JSON lines (request and trace ids included)."""

from __future__ import annotations

from scalelab.layers.web.logs import JsonFormatter
from scalelab.layers.web.logs import configure as _configure

__all__ = ["JsonFormatter", "configure"]


def configure(level: str = "info") -> None:
    """Route the server's loggers (ours and uvicorn's) to stderr as JSON lines."""
    _configure(level, ("scalelab.system.serve", "uvicorn", "uvicorn.error"))
