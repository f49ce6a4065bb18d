"""The `--trace-*` flags every server command shares (serve, generate serve, retrieval serve)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from scalelab.cli._output import stacked
from scalelab.layers.web.trace import TraceConfig


def trace_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Adds --trace-sample, --trace-out and --otlp-endpoint; the command receives them as
    `trace_sample`, `trace_out`, `otlp_endpoint` (build the config with `trace_config`)."""
    opts = [
        click.option("--trace-sample", "trace_sample", type=float, default=0.0,
                     show_default=True,
                     help="Share of requests (0..1) that start a trace; a client's sampled "
                          "traceparent is always followed once tracing is on."),
        click.option("--trace-out", "trace_out", default=None,
                     type=click.Path(dir_okay=False),
                     help="Append spans to this JSON Lines file (read it with `scalelab trace "
                          "show`); turns tracing on."),
        click.option("--otlp-endpoint", "otlp_endpoint", default=None,
                     help="Export spans over OTLP/HTTP instead, e.g. "
                          "http://127.0.0.1:4318/v1/traces; turns tracing on."),
    ]
    return stacked(opts)(f)


def trace_config(trace_sample: float, trace_out: str | None,
                 otlp_endpoint: str | None) -> TraceConfig:
    """The validated config (BadUsageError naming the flag when it is wrong)."""
    # absolute: uvicorn workers and a diagnose step may run from another directory
    out = str(Path(trace_out).resolve()) if trace_out else None
    return TraceConfig(sample=trace_sample, out=out, otlp_endpoint=otlp_endpoint)
