"""Shared helpers for the serve reliability tests: the serve suite's fixtures, the long/short
switch, the project's own load tester as a subprocess, and single-request latency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

# the serve suite's helper modules, imported the way tests/system/serve/conftest.py does (pytest
# runs with --import-mode=importlib, so they are not a package)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "system" / "serve"))

from serve_fixtures import (
    Evil,
    Server,
    add_model,
    flights_config,
    free_port,
    infer_body,
    start_server,
)

__all__ = [
    "LONG",
    "Evil",
    "Server",
    "add_model",
    "flights_config",
    "free_port",
    "infer_body",
    "median_single_ms",
    "run_load",
    "single_ms",
    "start_server",
]

LONG = os.environ.get("SCALELAB_LONG", "").strip() not in ("", "0", "false", "no")
"""True under `make test-reliability` (SCALELAB_LONG=1): the long form of each test."""

ANSWERED = {"status"}
"""Error kinds that are answers (an HTTP status); the others (timeout, refused, reset, other)
are requests the server never answered."""


def run_load(url: str, model: str, *extra: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """One level from `scalelab load --json` (OIP payload for `model`), no objective given.

    The level is returned whatever its requests did (the caller judges its successes), and
    the exit status is held to `load`'s contract: 1 when every request failed (the cause on
    stderr), else 0 — a level of failures never exits 0."""
    cmd = [sys.executable, "-m", "scalelab", "load", url, "--json", "--payload", "oip",
           "--model", model, "--no-cold-start", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert proc.returncode in (0, 1) and proc.stdout, \
        f"load tester failed ({proc.returncode}): {proc.stderr[-2000:]}"
    levels = json.loads(proc.stdout)["levels"]
    assert len(levels) == 1
    level = dict(levels[0])
    all_failed = level["requests"] > 0 and level["successes"] == 0
    assert proc.returncode == (1 if all_failed else 0), (
        f"load exited {proc.returncode} with {level['successes']} of {level['requests']} "
        f"requests answered: {proc.stderr[-2000:]}")
    if all_failed:
        assert proc.stderr.strip().splitlines()[-1].startswith("every request failed ("), \
            proc.stderr[-2000:]
    return level


def single_ms(url: str, model: str, client: httpx.Client) -> float:
    """Latency of one inference request on an idle connection, in ms (must answer 200)."""
    body = infer_body(1)
    t0 = time.perf_counter()
    r = client.post(f"{url}/v2/models/{model}/infer", json=body)
    dt = (time.perf_counter() - t0) * 1000
    assert r.status_code == 200, r.text
    return dt


def median_single_ms(url: str, model: str, client: httpx.Client, n: int = 5) -> float:
    xs = sorted(single_ms(url, model, client) for _ in range(n))
    return xs[n // 2]
